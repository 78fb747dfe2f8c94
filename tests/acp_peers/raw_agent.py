"""An ACP agent written by hand (no SDK) that tries to reach the client's own permission prompt
around the proxy: a permission request inside a JSON-RPC batch, one sent as a notification, one
whose ``method`` key is given twice, and a line that is not JSON. Its reply (one agent message)
lists the answers it got, by request id."""

import json
import sys

PERMISSION = {"sessionId": "s-1", "toolCall": {"toolCallId": "t", "title": "rm", "kind": "execute",
                                               "rawInput": {"command": "rm -rf build"}},
              "options": [{"optionId": "yes", "name": "Allow", "kind": "allow_once"},
                          {"optionId": "no", "name": "Reject", "kind": "reject_once"}]}


def send(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def request(id, method, params):
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": params}


def main() -> None:
    answers = {}
    for line in sys.stdin:
        message = json.loads(line)
        method, id = message.get("method"), message.get("id")
        if method == "initialize":
            send(json.dumps({"jsonrpc": "2.0", "id": id, "result": {"protocolVersion": 1, "agentCapabilities": {}}}))
        elif method == "session/new":
            send(json.dumps({"jsonrpc": "2.0", "id": id, "result": {"sessionId": "s-1"}}))
        elif method == "session/prompt":
            send(json.dumps([request(100, "session/request_permission", PERMISSION)]))
            send(json.dumps({"jsonrpc": "2.0", "method": "session/request_permission", "params": PERMISSION}))
            dup = json.dumps(request(101, "session/update", PERMISSION))
            send(dup[:-1] + ', "method": "session/request_permission"}')
            send("this is not JSON")
            while len(answers) < 2:
                # A plain readline: both replies may already sit in stdin's buffer, where a select on its
                # descriptor would not see the second (the test's own timeout bounds the wait).
                text = sys.stdin.readline()
                if not text:
                    break
                reply = json.loads(text)
                if reply.get("id") in (100, 101):
                    answers[str(reply["id"])] = reply.get("result", {}).get("outcome")
            update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": json.dumps(
                [{"id": k, "outcome": v.get("outcome") if v else None, "option": (v or {}).get("optionId"),
                  "meta": None} for k, v in sorted(answers.items())])}}
            send(json.dumps({"jsonrpc": "2.0", "method": "session/update",
                             "params": {"sessionId": "s-1", "update": update}}))
            send(json.dumps({"jsonrpc": "2.0", "id": id, "result": {"stopReason": "end_turn"}}))
        elif id is not None and method is not None:
            send(json.dumps({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "not here"}}))


if __name__ == "__main__":
    main()
