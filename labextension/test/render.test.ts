import { describe, expect, it, vi } from 'vitest';
import { FOLD_CHARS } from '../src/format';
import { Handlers, LOAD_HINT, renderPanel } from '../src/render';
import { PanelState, initialState, reduce } from '../src/state';
import { card, snapshot } from './fixtures';
import { Snapshot } from '../src/protocol';

const NOW = Date.parse('2026-12-01T12:03:00Z');

function handlers(): Handlers & { [k: string]: ReturnType<typeof vi.fn> } {
  return {
    answer: vi.fn(), toggleUnfold: vi.fn(), toggleFinished: vi.fn(), openRun: vi.fn(), verify: vi.fn(), refresh: vi.fn(),
    approvePlan: vi.fn(), rejectPlan: vi.fn(), editPlan: vi.fn(), editReason: vi.fn()
  } as never;
}

function shown(snap: Snapshot, extra: (s: PanelState) => PanelState = s => s): PanelState {
  let s = reduce(initialState, { type: 'notebook', path: 'a.ipynb' });
  s = reduce(s, { type: 'snapshot', snapshot: snap, version: 1 });
  return extra(s);
}

function render(state: PanelState, hs = handlers()): HTMLElement {
  const el = renderPanel(state, hs, NOW, document);
  document.body.replaceChildren(el);
  return el;
}

describe('the inbox', () => {
  it('shows agent, tool, family, the asking line and why, age, every argument and one button per answer', () => {
    const el = render(shown(snapshot()));
    const c = el.querySelector('[data-card-id="pd-1"]')!;
    expect(c.getAttribute('aria-label')).toBe('Decision: clerk wants write_file, waiting');  // (no goal known)
    expect(c.querySelector('.apollia-card-head')!.textContent).toContain('clerk · write_file · write');
    expect(c.querySelector('.apollia-age')!.textContent).toBe('asked 3 min ago');
    expect(c.querySelector('.apollia-asking-line')!.textContent).toBe('asked by governance line 6: writing needs consent');
    expect([...c.querySelectorAll('.apollia-arg-name')].map(n => n.textContent)).toEqual(['path', 'content']);
    const buttons = [...c.querySelectorAll<HTMLButtonElement>('button[data-answer]')];
    expect(buttons.map(b => b.textContent)).toEqual(['once', 'always', 'never']);
    expect(buttons.every(b => b.type === 'button' && b.getAttribute('aria-label')!.startsWith('Answer '))).toBe(true);
    expect(el.querySelector('#apollia-h-inbox')!.textContent).toBe('Inbox (1 waiting)');
  });

  it('a click on an answer calls the handler with the card and the answer', () => {
    const hs = handlers();
    const el = render(shown(snapshot()), hs);
    el.querySelector<HTMLButtonElement>('button[data-answer="once"]')!.click();
    expect(hs.answer).toHaveBeenCalledWith('pd-1', 'once');
  });

  it('a long argument is folded behind "show all", says how much is hidden, and unfolds whole', () => {
    const long = 'y'.repeat(FOLD_CHARS + 500);
    const snap = snapshot({ inbox: [card({ arguments: { content: long } })] });
    const hs = handlers();
    let el = render(shown(snap), hs);
    const value = () => el.querySelector('.apollia-arg-value pre')!.textContent!;
    expect(value().length).toBe(FOLD_CHARS);
    expect(el.querySelector('.apollia-folded-note')!.textContent).toBe('… 500 more characters folded');
    const toggle = el.querySelector<HTMLButtonElement>('.apollia-arg-value button')!;
    expect(toggle.textContent).toBe('show all');
    expect(toggle.getAttribute('aria-expanded')).toBe('false');
    toggle.click();
    expect(hs.toggleUnfold).toHaveBeenCalledWith('pd-1/content');
    el = render(shown(snap, s => reduce(s, { type: 'toggle-unfold', key: 'pd-1/content' })), hs);
    expect(value()).toBe(long);
    expect(el.querySelector('.apollia-folded-note')).toBeNull();
    expect(el.querySelector('.apollia-arg-value button')!.getAttribute('aria-expanded')).toBe('true');
  });

  it('MCP hints are shown when the card has them', () => {
    const el = render(shown(snapshot({ inbox: [card({ hints: { destructiveHint: true, readOnlyHint: false } })] })));
    expect(el.querySelector('.apollia-hints')!.textContent).toBe('hints: destructiveHint=truereadOnlyHint=false');
  });

  it('an answered card is frozen with who answered and when, with no button', () => {
    const el = render(shown(snapshot({ inbox: [card({ answered: { answer: 'once', by: 'ann', at: '2026-12-01T12:01:05Z' } })] })));
    const c = el.querySelector('[data-card-id="pd-1"]')!;
    expect(c.classList.contains('apollia-card-answered')).toBe(true);
    expect(c.querySelectorAll('button[data-answer]')).toHaveLength(0);
    expect(c.querySelector('.apollia-answered')!.textContent).toMatch(/^answered once by ann at \d\d:\d\d:05$/);
    expect(el.querySelector('#apollia-h-inbox')!.textContent).toBe('Inbox');
  });

  it('while an answer is in flight its buttons are disabled (no double answer); a refusal is shown on the card', () => {
    let el = render(shown(snapshot(), s => reduce(s, { type: 'answer-sent', cardId: 'pd-1', answer: 'once' })));
    expect([...el.querySelectorAll<HTMLButtonElement>('button[data-answer]')].every(b => b.disabled)).toBe(true);
    expect(el.querySelector('.apollia-sending')!.textContent).toBe('sending once…');
    el = render(shown(snapshot(), s => reduce(s, { type: 'answer-failed', cardId: 'pd-1', error: { code: 'CONFLICT', message: 'already answered by bob' } })));
    expect(el.querySelector('.apollia-card-error')!.textContent).toBe('CONFLICT: already answered by bob');
    expect(el.querySelector('.apollia-card-error')!.getAttribute('role')).toBe('alert');
  });

  it('an empty inbox says so', () => {
    expect(render(shown(snapshot({ inbox: [] }))).querySelector('.apollia-inbox .apollia-empty')!.textContent)
      .toBe('Nothing waits for a decision.');
  });
});

describe('agents, runs and the journal', () => {
  it('agents with states; a running run with its budget bar and step; finished ones folded', () => {
    const hs = handlers();
    const el = render(shown(snapshot()), hs);
    expect(el.querySelector('.apollia-agent-row')!.textContent).toBe('clerk ready · 1 in flight');
    const run = el.querySelector('[data-run-id="run-1"]')!;
    const bar = run.querySelector('[role="progressbar"]')!;
    expect(bar.getAttribute('aria-valuenow')).toBe('3');
    expect(bar.getAttribute('aria-valuemax')).toBe('10');
    expect(run.querySelector<HTMLElement>('.apollia-budget-fill')!.style.width).toBe('30%');
    expect(run.querySelector('.apollia-step')!.textContent).toBe('Step 2 of 2: Write a summary file');
    expect(el.querySelector('[data-run-id="run-0"]')).toBeNull(); // folded
    const toggle = el.querySelector<HTMLButtonElement>('.apollia-finished-toggle')!;
    expect(toggle.textContent).toBe('Show 1 finished');
    toggle.click();
    expect(hs.toggleFinished).toHaveBeenCalled();
    const open = render(shown(snapshot(), s => reduce(s, { type: 'toggle-finished' })));
    expect(open.querySelector('[data-run-id="run-0"]')).not.toBeNull();
  });

  it('a run\'s reasoning is folded under it, as text only, and says how much more there is', () => {
    const snap = snapshot();
    snap.runs[0].reasoning = { step: 2, text: 'I will list the folder.\n\n[redacted reasoning]<b>x</b>', chars: 9000 };
    const run = render(shown(snap)).querySelector('[data-run-id="run-1"]')!;
    const folded = run.querySelector<HTMLDetailsElement>('details.apollia-reasoning')!;
    expect(folded.open).toBe(false);
    expect(folded.querySelector('summary')!.textContent).toBe('Reasoning of step 2 (9000 characters)');
    const text = folded.querySelector('.apollia-reasoning-text')!;
    expect(text.textContent!.startsWith('I will list the folder.\n\n[redacted reasoning]<b>x</b> … (+')).toBe(true);
    expect(text.querySelector('b')).toBeNull(); // never markup
    snap.runs[0].reasoning = null;
    expect(render(shown(snap)).querySelector('.apollia-reasoning')).toBeNull();
  });

  it('a click on a run asks for its entries, which are listed under it', () => {
    const hs = handlers();
    const el = render(shown(snapshot()), hs);
    el.querySelector<HTMLButtonElement>('[data-run-id="run-1"] .apollia-run-open')!.click();
    expect(hs.openRun).toHaveBeenCalledWith('run-1');
    const loading = render(shown(snapshot(), s => reduce(s, { type: 'open-run', runId: 'run-1' })));
    expect(loading.querySelector('[data-run-id="run-1"] .apollia-status')!.textContent).toBe('Loading its journal entries…');
    const listed = render(shown(snapshot(), s => reduce(reduce(s, { type: 'open-run', runId: 'run-1' }),
      { type: 'entries', runId: 'run-1', entries: [{ seq: 9, kind: 'answer', payload: { answer: 'once', by: 'ann' } }] })));
    const entries = listed.querySelector('[data-run-id="run-1"] .apollia-run-entries')!;
    expect(entries.textContent).toBe('#9 answer answer=once by=ann');
  });

  it('the journal: size, root, last checkpoint, the badge, latest entries; Verify now', () => {
    const hs = handlers();
    const el = render(shown(snapshot()), hs);
    expect(el.querySelector('.apollia-journal-size')!.textContent).toBe('42');
    expect(el.querySelector('.apollia-head code')!.textContent).toBe('abcdef012345');
    expect(el.querySelector('.apollia-verify')!.textContent).toBe('verified: all 42 entries');
    expect(el.querySelector('.apollia-latest')!.textContent).toBe('#42 decision tool=write_file outcome=ask');
    el.querySelector<HTMLButtonElement>('[aria-label="Verify the journal now"]')!.click();
    expect(hs.verify).toHaveBeenCalled();
    const bad = render(shown(snapshot(), s => reduce(s, { type: 'verify-done', result: { state: 'failed', checked_size: 42, first_bad_seq: 17 } })));
    expect(bad.querySelector('.apollia-verify-failed')!.textContent).toBe('does NOT verify from #17');
  });
});

describe('modes and connection states', () => {
  it('served mode says whose runs it shows', () => {
    const el = render(shown(snapshot({ mode: 'served', server: 'http://127.0.0.1:8765' })));
    expect(el.querySelector('.apollia-banner')!.textContent).toBe('shared home: showing every run of http://127.0.0.1:8765');
    expect(render(shown(snapshot())).querySelector('.apollia-banner')).toBeNull();
  });

  it('a kernel without the extension: how to load it, and a button to connect again', () => {
    const hs = handlers();
    const s = reduce(reduce(initialState, { type: 'notebook', path: 'a.ipynb' }), { type: 'not-loaded' });
    const el = render(s, hs);
    expect(el.querySelector('.apollia-not-loaded pre')!.textContent).toBe(LOAD_HINT);
    expect(LOAD_HINT).toBe('%load_ext apollia_nb');
    el.querySelector<HTMLButtonElement>('.apollia-not-loaded button')!.click();
    expect(hs.refresh).toHaveBeenCalled();
    expect(el.querySelector('.apollia-inbox')).toBeNull();
  });

  it('no notebook, no kernel, and a connection error each say what to do', () => {
    expect(render(initialState).textContent).toContain('Open a notebook');
    const noKernel = reduce(reduce(initialState, { type: 'notebook', path: 'a.ipynb' }), { type: 'kernel-gone' });
    expect(render(noKernel).textContent).toContain('has no running kernel');
    const err = reduce(noKernel, { type: 'connection-error', message: 'PANEL_TIMEOUT: slow' });
    expect(render(err).querySelector('[role="alert"]')!.textContent).toContain('PANEL_TIMEOUT: slow');
  });

  it('a part the kernel could not read is reported', () => {
    const el = render(shown(snapshot({ problems: [{ part: 'inbox', code: 'GOVERNANCE_UNREADABLE', message: 'governance.db is locked' }] })));
    expect(el.querySelector('.apollia-problem')!.textContent).toBe('inbox: GOVERNANCE_UNREADABLE: governance.db is locked');
  });
});

describe('connected before the first snapshot', () => {
  it('shows the kernel\'s error with Retry, or Loading…', () => {
    const base = reduce(reduce(initialState, { type: 'notebook', path: 'a.ipynb' }), { type: 'connected' });
    expect(render(base).textContent).toBe('Loading…');
    const hs = handlers();
    const el = render(reduce(base, { type: 'snapshot-failed', error: { code: 'CONFLICT', message: 'no home is open' } }), hs);
    expect(el.querySelector('[role="alert"] p')!.textContent).toBe('CONFLICT: no home is open');
    el.querySelector<HTMLButtonElement>('[role="alert"] button')!.click();
    expect(hs.refresh).toHaveBeenCalled();
  });
});
