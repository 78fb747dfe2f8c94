import { describe, expect, it, vi } from 'vitest';
import { KernelComm, KernelLike, KernelLink } from '../src/link';
import { Handlers, renderPanel } from '../src/render';
import { PlanItem, Snapshot } from '../src/protocol';
import {
  Action, NotificationBook, PanelState, badgeCount, editedSteps, initialState, itemKey, newlyWaiting, noLongerWaiting,
  reduce, runStateWords, verifyWords
} from '../src/state';
import { notificationText } from '../src/format';
import { card, snapshot } from './fixtures';

const NOW = Date.parse('2026-12-01T12:03:00Z');

function plan(over: Partial<PlanItem> = {}): PlanItem {
  return {
    kind: 'plan', id: 'task-7', task_id: 'task-7', run_id: 'run-7', agent: 'clerk', goal: 'Tidy the notes',
    steps: ['Read the notes', 'Write a summary'], asked_at: '2026-12-01T12:02:00Z', runs: 'kernel', ...over
  };
}

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

describe('cards say which task they belong to', () => {
  it('two cards alike but for their task: each shows its goal and its task, run and card ids', () => {
    const snap = snapshot({
      inbox: [
        card({ id: 'pd-1', task_id: 'task-1', run_id: 'run-1', owner: 'task', goal: 'Summarise the Monday notes' }),
        card({ id: 'pd-2', task_id: 'task-2', run_id: 'run-2', owner: 'task', goal: 'Summarise the Friday notes' })
      ]
    });
    const el = render(shown(snap));
    const one = el.querySelector('[data-card-id="pd-1"]')!;
    const two = el.querySelector('[data-card-id="pd-2"]')!;
    expect(one.querySelector('.apollia-goal')!.textContent).toBe('task: Summarise the Monday notes');
    expect(two.querySelector('.apollia-goal')!.textContent).toBe('task: Summarise the Friday notes');
    expect(one.querySelector('.apollia-ids')!.textContent).toBe('task task-1 · run run-1 · card pd-1');
    expect(two.querySelector('.apollia-ids')!.textContent).toBe('task task-2 · run run-2 · card pd-2');
    expect(one.getAttribute('aria-label')).toBe('Decision: clerk wants write_file for "Summarise the Monday notes", waiting');
    expect(one.textContent).not.toBe(two.textContent.replace('pd-2', 'pd-1'));
  });

  it('a chat\'s card names the chat; a card whose run is not listed says its goal is not known', () => {
    const el = render(shown(snapshot({
      inbox: [card({ id: 'pd-3', session_id: 'chat-1', owner: 'chat', goal: 'write a for me' }),
        card({ id: 'pd-4', task_id: 'task-9', goal: null })]
    })));
    expect(el.querySelector('[data-card-id="pd-3"] .apollia-goal')!.textContent).toBe('chat: write a for me');
    expect(el.querySelector('[data-card-id="pd-3"] .apollia-ids')!.textContent).toBe('chat chat-1 · run run-1 · card pd-3');
    expect(el.querySelector('[data-card-id="pd-4"] .apollia-goal')!.textContent).toBe('task: goal not known');
  });

  it('the notification names the goal; a plan\'s asks for approval', () => {
    expect(notificationText([card({ goal: 'Summarise the notes' })]))
      .toBe('apollia: clerk asks to use write_file (write) for "Summarise the notes": answer it in the apollia panel');
    expect(notificationText([plan()])).toBe('apollia: clerk asks you to approve its plan for "Tidy the notes": answer it in the apollia panel');
    expect(notificationText([card(), plan()])).toBe('apollia: 2 new decisions wait in the apollia panel');
  });
});

describe('plans waiting for approval', () => {
  it('are in the inbox with their steps, approve, a reason and reject; they count on the badge', () => {
    const hs = handlers();
    const state = shown(snapshot({ inbox: [card(), plan()] }));
    const el = render(state, hs);
    const p = el.querySelector('[data-plan-id="task-7"]')!;
    expect(p.querySelector('.apollia-goal')!.textContent).toBe('task: Tidy the notes');
    expect(p.querySelector('.apollia-ids')!.textContent).toBe('task task-7 · run run-7');
    expect(p.querySelector<HTMLTextAreaElement>('textarea')!.value).toBe('Read the notes\nWrite a summary');
    expect(el.querySelector('#apollia-h-inbox')!.textContent).toBe('Inbox (2 waiting)');
    expect(badgeCount(state)).toBe(2);
    p.querySelector<HTMLButtonElement>('button[data-answer="approve"]')!.click();
    expect(hs.approvePlan).toHaveBeenCalledWith('task-7');
    const reason = p.querySelector<HTMLInputElement>('input.apollia-plan-reason')!;
    reason.value = 'not today';
    reason.dispatchEvent(new Event('input'));
    expect(hs.editReason).toHaveBeenCalledWith('task-7', 'not today');
    p.querySelector<HTMLButtonElement>('button[data-answer="reject"]')!.click();
    expect(hs.rejectPlan).toHaveBeenCalledWith('task-7');
    const steps = p.querySelector<HTMLTextAreaElement>('textarea')!;
    steps.value = 'Read every note';
    steps.dispatchEvent(new Event('input'));
    expect(hs.editPlan).toHaveBeenCalledWith('task-7', 'Read every note');
  });

  it('a draft survives a new snapshot while the plan waits and goes with it; sending disables; a failure shows', () => {
    let s = shown(snapshot({ inbox: [plan()] }));
    s = reduce(s, { type: 'plan-edit', taskId: 'task-7', text: 'Read every note' });
    s = reduce(s, { type: 'snapshot', snapshot: snapshot({ inbox: [plan()] }), version: 2 });
    expect(render(s).querySelector<HTMLTextAreaElement>('[data-plan-id="task-7"] textarea')!.value).toBe('Read every note');
    const sending = reduce(s, { type: 'plan-sent', taskId: 'task-7', verdict: 'approve' });
    const el = render(sending);
    expect([...el.querySelectorAll('[data-plan-id="task-7"] button, [data-plan-id="task-7"] textarea')]
      .every(b => b.hasAttribute('disabled'))).toBe(true);
    expect(el.querySelector('.apollia-sending')!.textContent).toBe('sending approve…');
    const failed = reduce(sending, { type: 'plan-failed', taskId: 'task-7', error: { code: 'CONFLICT', message: 'not waiting' } });
    expect(render(failed).querySelector('[data-plan-id="task-7"] [role="alert"]')!.textContent).toBe('CONFLICT: not waiting');
    const gone = reduce(failed, { type: 'snapshot', snapshot: snapshot({ inbox: [] }), version: 3 });
    expect(gone.planDrafts).toEqual({});
    expect(gone.planErrors).toEqual({});
  });

  it('the steps sent: null as proposed; the edited lines trimmed, blank ones dropped', () => {
    const p = plan();
    expect(editedSteps(p, undefined)).toBeNull();
    expect(editedSteps(p, ' Read the notes \n\nWrite a summary\n')).toBeNull();
    expect(editedSteps(p, 'Read every note\n  \n Write it down ')).toEqual(['Read every note', 'Write it down']);
    expect(editedSteps(p, '  \n ')).toEqual([]);
  });
});

describe('words a person reads', () => {
  it('run states', () => {
    const run = { kind: 'task', agent: 'clerk', status: 'waiting' };
    expect(runStateWords({ ...run, awaiting_plan_approval: true })).toBe('waiting for its plan to be approved');
    expect(runStateWords({ ...run, waiting_cards: 2 })).toBe('waiting for your answer (2 questions)');
    expect(runStateWords({ ...run, waiting_cards: 1 })).toBe('waiting for your answer (1 question)');
    expect(runStateWords({ ...run, waiting_cards: 0 })).toBe('waiting for a person (suspended)');
    expect(runStateWords({ ...run, status: 'running' })).toBe('running');
    const el = render(shown(snapshot({
      runs: [{ id: 'task-7', run_id: 'run-7', kind: 'task', agent: 'clerk', status: 'waiting', waiting: true,
        awaiting_plan_approval: true, title: 'Tidy' }]
    })));
    expect(el.querySelector('[data-run-id="run-7"] .apollia-state')!.textContent).toBe('waiting for its plan to be approved');
    expect(el.textContent).not.toContain('waiting · waiting');
  });

  it('the verification badge never claims more than was checked', () => {
    const j = snapshot().journal;
    expect(verifyWords({ ...j, size: 35, verify: { state: 'ok', checked_size: 23 } }, false))
      .toEqual({ state: 'behind', text: 'verified 23 of 35 entries; the newer ones are checked next' });
    expect(verifyWords({ ...j, size: 35, verify: { state: 'ok', checked_size: 35 } }, false).text).toBe('verified: all 35 entries');
    expect(verifyWords({ ...j, size: 35, verify: { state: 'running', checked_size: 23 } }, false).text)
      .toBe('verifying… (23 of 35 verified so far)');
    expect(verifyWords({ ...j, size: 35, verify: { state: 'failed', checked_size: 35, first_bad_seq: 4 } }, false).text)
      .toBe('does NOT verify from #4');
    expect(verifyWords({ ...j, size: 35, verify: { state: 'ok' } }, false).state).toBe('unknown');
    expect(verifyWords({ ...j, size: 35, verify: null }, false).text).toBe('not verified yet');
    const el = render(shown(snapshot({ journal: { ...j, size: 44, verify: { state: 'ok', checked_size: 1 } } })));
    expect(el.querySelector('.apollia-verify-behind')!.textContent).toBe('verified 1 of 44 entries; the newer ones are checked next');
  });
});

describe('notifications go when their questions are answered', () => {
  it('keys per kind; newly waiting; no longer waiting', () => {
    const s = shown(snapshot({ inbox: [card(), plan()] }));
    expect(newlyWaiting(new Set(), s).map(itemKey)).toEqual(['card:pd-1', 'plan:task-7']);
    const answered = reduce(s, { type: 'snapshot', version: 2, snapshot: snapshot({
      inbox: [card({ answered: { answer: 'once', by: 'ann', at: 't' } })]
    }) });
    expect(noLongerWaiting(['card:pd-1', 'plan:task-7'], answered)).toEqual(['card:pd-1', 'plan:task-7']);
    expect(noLongerWaiting(['card:pd-1', 'plan:task-7'], s)).toEqual([]);
  });

  it('a notification for several questions goes when none of them waits', () => {
    const book = new NotificationBook();
    book.add('n1', ['card:a']);
    book.add('n2', ['card:b', 'card:c']);
    expect(book.answered(['card:b'])).toEqual([]);
    expect(book.answered(['card:a', 'card:c'])).toEqual(['n1', 'n2']);
    expect(book.answered(['card:a'])).toEqual([]);
  });
});

describe('the link answers plans', () => {
  class Kernel implements KernelLike {
    info = Promise.resolve({});
    supportsSubshells = false;
    sent: Record<string, unknown>[] = [];
    constructor(private readonly reply: (req: Record<string, unknown>) => Record<string, unknown>) {}
    createComm(): KernelComm {
      const comm = {
        subshellId: null, subshellStarted: Promise.resolve(), commsOverSubshells: 'disabled',
        onMsg: (_: { content: { data: unknown } }) => {}, onClose: (_: unknown) => {},
        open() {},
        send: (data: Record<string, unknown>) => {
          this.sent.push(data);
          const r = this.reply(data);
          queueMicrotask(() => comm.onMsg({ content: { data: r } }));
        },
        close() {}
      };
      return comm;
    }
  }

  it('approve as edited, reject with a reason: the ops and fields the kernel reads; an error is kept', async () => {
    const k = new Kernel(req => req.op === 'snapshot' ? { id: req.id, ok: true, data: snapshot({ inbox: [plan()] }) }
      : req.op === 'reject_plan' ? { id: req.id, ok: false, error: { code: 'CONFLICT', message: 'not waiting' } }
        : { id: req.id, ok: true, data: { task_id: 'task-7', decided: 'approved (edited)' } });
    const actions: Action[] = [];
    const link = new KernelLink(k, a => actions.push(a));
    await link.connect();
    await link.answerPlan('task-7', 'approve', ['Read every note'], '');
    await link.answerPlan('task-7', 'approve', null, '');
    await link.answerPlan('task-7', 'reject', null, 'not today');
    const plans = k.sent.filter(m => m.op !== 'snapshot').map(({ id: _id, ...m }) => m);
    expect(plans).toEqual([
      { op: 'approve_plan', task_id: 'task-7', steps: ['Read every note'] },
      { op: 'approve_plan', task_id: 'task-7' },
      { op: 'reject_plan', task_id: 'task-7', reason: 'not today' }
    ]);
    const types = actions.filter(a => a.type.startsWith('plan-')).map(a => a.type);
    expect(types).toEqual(['plan-sent', 'plan-done', 'plan-sent', 'plan-done', 'plan-sent', 'plan-failed']);
  });
});
