// witnesscheck checks an apollia-nb checkpoint, its witness cosignatures and Merkle proofs with
// Go's reference packages: golang.org/x/mod/sumdb/note opens the note (the journal's Ed25519 key
// and a note.Verifier for C2SP tlog-cosignature/v1), golang.org/x/mod/sumdb/tlog checks the
// inclusion and consistency proofs. It reads one JSON object on stdin, prints what held, and
// exits 1 naming the first check that failed.
package main

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

type input struct {
	LogKey      string   `json:"log_vkey"`
	WitnessKeys []string `json:"witness_vkeys"`
	Note        string   `json:"note"`
	Inclusion   *struct {
		Index     int64    `json:"index"`
		Size      int64    `json:"size"`
		EntryHash string   `json:"entry_hash"`
		Path      []string `json:"path"`
	} `json:"inclusion"`
	Consistency *struct {
		OldSize int64    `json:"old_size"`
		OldRoot string   `json:"old_root"`
		Path    []string `json:"path"`
	} `json:"consistency"`
}

// cosignatureV1 is a note.Verifier for C2SP tlog-cosignature/v1 (signature type 0x04).
type cosignatureV1 struct {
	name string
	hash uint32
	key  ed25519.PublicKey
}

func (v cosignatureV1) Name() string    { return v.name }
func (v cosignatureV1) KeyHash() uint32 { return v.hash }
func (v cosignatureV1) Verify(msg, sig []byte) bool {
	if len(sig) != 8+ed25519.SignatureSize {
		return false
	}
	t := binary.BigEndian.Uint64(sig[:8])
	signed := append([]byte(fmt.Sprintf("cosignature/v1\ntime %d\n", t)), msg...)
	return ed25519.Verify(v.key, signed, sig[8:])
}

func newCosignatureVerifier(vkey string) (note.Verifier, error) {
	parts := strings.SplitN(vkey, "+", 3)
	if len(parts) != 3 {
		return nil, errors.New("malformed witness key")
	}
	want, err := strconv.ParseUint(parts[1], 16, 32)
	if err != nil {
		return nil, err
	}
	raw, err := base64.StdEncoding.DecodeString(parts[2])
	if err != nil || len(raw) != 33 || raw[0] != 0x04 {
		return nil, errors.New("not a cosignature/v1 key")
	}
	h := sha256.Sum256(append(append([]byte(parts[0]), '\n', 0x04), raw[1:]...))
	hash := binary.BigEndian.Uint32(h[:4])
	if uint64(hash) != want {
		return nil, errors.New("witness key hash does not match")
	}
	return cosignatureV1{parts[0], hash, ed25519.PublicKey(raw[1:])}, nil
}

func hash(text string) (tlog.Hash, error) {
	var h tlog.Hash
	raw, err := hex.DecodeString(text)
	if err != nil || len(raw) != tlog.HashSize {
		return h, fmt.Errorf("not a hex hash: %q", text)
	}
	copy(h[:], raw)
	return h, nil
}

func hashes(texts []string) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(texts))
	for i, t := range texts {
		h, err := hash(t)
		if err != nil {
			return nil, err
		}
		out[i] = h
	}
	return out, nil
}

func fail(format string, args ...any) {
	fmt.Printf("FAIL "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	var in input
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		fail("input: %v", err)
	}
	logVerifier, err := note.NewVerifier(in.LogKey)
	if err != nil {
		fail("log key: %v", err)
	}
	verifiers := []note.Verifier{logVerifier}
	for _, k := range in.WitnessKeys {
		v, err := newCosignatureVerifier(k)
		if err != nil {
			fail("witness key %s: %v", k, err)
		}
		verifiers = append(verifiers, v)
	}
	n, err := note.Open([]byte(in.Note), note.VerifierList(verifiers...))
	if err != nil {
		fail("note: %v", err)
	}
	seen := map[string]bool{}
	for _, s := range n.Sigs {
		seen[fmt.Sprintf("%s+%08x", s.Name, s.Hash)] = true
	}
	for _, v := range verifiers {
		if !seen[fmt.Sprintf("%s+%08x", v.Name(), v.KeyHash())] {
			fail("note: no verified signature from %s", v.Name())
		}
	}
	fmt.Printf("note ok: %d verified signature(s)\n", len(n.Sigs))

	lines := strings.Split(n.Text, "\n")
	if len(lines) < 4 {
		fail("checkpoint: too few lines")
	}
	size, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil {
		fail("checkpoint size: %v", err)
	}
	rootRaw, err := base64.StdEncoding.DecodeString(lines[2])
	if err != nil || len(rootRaw) != tlog.HashSize {
		fail("checkpoint root")
	}
	var root tlog.Hash
	copy(root[:], rootRaw)

	if in.Inclusion != nil {
		entry, err := hex.DecodeString(in.Inclusion.EntryHash)
		if err != nil {
			fail("entry hash: %v", err)
		}
		path, err := hashes(in.Inclusion.Path)
		if err != nil {
			fail("inclusion path: %v", err)
		}
		if in.Inclusion.Size != size {
			fail("inclusion: proof is for size %d, the checkpoint has %d", in.Inclusion.Size, size)
		}
		if err := tlog.CheckRecord(tlog.RecordProof(path), size, root, in.Inclusion.Index, tlog.RecordHash(entry)); err != nil {
			fail("inclusion: %v", err)
		}
		fmt.Printf("inclusion ok: leaf %d of %d\n", in.Inclusion.Index, size)
	}
	if in.Consistency != nil {
		old, err := hash(in.Consistency.OldRoot)
		if err != nil {
			fail("old root: %v", err)
		}
		path, err := hashes(in.Consistency.Path)
		if err != nil {
			fail("consistency path: %v", err)
		}
		if err := tlog.CheckTree(tlog.TreeProof(path), size, root, in.Consistency.OldSize, old); err != nil {
			fail("consistency: %v", err)
		}
		fmt.Printf("consistency ok: %d extends %d\n", size, in.Consistency.OldSize)
	}
}
