/**
 * The panel's view state and the pure reducer that moves it: values in, values out.
 * Rendering (`render.ts`) reads a state; the shell (`panel.ts`) feeds actions in.
 */

import { Answered, Card, ErrorBody, InboxItem, Journal, JournalEntry, PlanItem, Run, Snapshot, VerifyResult, isPlan } from './protocol';

export type Connection =
  | { kind: 'no-notebook' }
  | { kind: 'no-kernel' }
  | { kind: 'connecting' }
  | { kind: 'not-loaded' }
  | { kind: 'connected' }
  | { kind: 'error'; message: string };

export interface RunEntries {
  runId: string;
  entries: JournalEntry[] | null; // null: loading
  error: string | null;
}

export interface PanelState {
  connection: Connection;
  notebook: string | null;
  snapshot: Snapshot | null;
  /** The highest `changed` version pushed so far, and the one the snapshot answered. */
  version: number;
  snapshotVersion: number;
  /** Answers sent and not yet replied to, by card id. */
  answering: Record<string, string>;
  /** The last failed answer of a card, shown on it until the next snapshot shows it answered. */
  cardErrors: Record<string, ErrorBody>;
  /** A plan's steps as edited in the panel (one per line), by task id; absent: as proposed. */
  planDrafts: Record<string, string>;
  /** The reason typed for rejecting a plan, by task id. */
  planReasons: Record<string, string>;
  /** Plan answers sent and not yet replied to ("approve" or "reject"), by task id. */
  planSending: Record<string, string>;
  /** The last failed plan answer, by task id (until the plan no longer waits). */
  planErrors: Record<string, ErrorBody>;
  /** "show all" unfolded, by `cardId/argumentName`. */
  unfolded: Record<string, boolean>;
  showFinished: boolean;
  openRun: RunEntries | null;
  verifying: boolean;
  verifyError: string | null;
  error: string | null;
}

export const initialState: PanelState = {
  connection: { kind: 'no-notebook' },
  notebook: null,
  snapshot: null,
  version: 0,
  snapshotVersion: 0,
  answering: {},
  cardErrors: {},
  planDrafts: {},
  planReasons: {},
  planSending: {},
  planErrors: {},
  unfolded: {},
  showFinished: false,
  openRun: null,
  verifying: false,
  verifyError: null,
  error: null
};

export type Action =
  | { type: 'notebook'; path: string | null }
  | { type: 'kernel-gone' }
  | { type: 'connecting' }
  | { type: 'not-loaded' }
  | { type: 'connected' }
  | { type: 'connection-error'; message: string }
  | { type: 'changed'; version: number }
  | { type: 'snapshot'; snapshot: Snapshot; version: number }
  | { type: 'snapshot-failed'; error: ErrorBody }
  | { type: 'answer-sent'; cardId: string; answer: string }
  | { type: 'answer-done'; cardId: string }
  | { type: 'answer-failed'; cardId: string; error: ErrorBody }
  | { type: 'plan-edit'; taskId: string; text: string }
  | { type: 'plan-reason'; taskId: string; text: string }
  | { type: 'plan-sent'; taskId: string; verdict: 'approve' | 'reject' }
  | { type: 'plan-done'; taskId: string }
  | { type: 'plan-failed'; taskId: string; error: ErrorBody }
  | { type: 'toggle-unfold'; key: string }
  | { type: 'toggle-finished' }
  | { type: 'open-run'; runId: string }
  | { type: 'close-run' }
  | { type: 'entries'; runId: string; entries: JournalEntry[] }
  | { type: 'entries-failed'; runId: string; error: ErrorBody }
  | { type: 'verify-start' }
  | { type: 'verify-done'; result: VerifyResult }
  | { type: 'verify-failed'; error: ErrorBody };

/** What a kernel change resets: everything that belonged to the previous kernel. */
function forKernel(state: PanelState, connection: Connection): PanelState {
  return {
    ...state,
    connection,
    snapshot: null,
    version: 0,
    snapshotVersion: 0,
    answering: {},
    cardErrors: {},
    planDrafts: {},
    planReasons: {},
    planSending: {},
    planErrors: {},
    openRun: null,
    verifying: false,
    verifyError: null,
    error: null
  };
}

export function reduce(state: PanelState, action: Action): PanelState {
  switch (action.type) {
    case 'notebook':
      return { ...forKernel(state, action.path ? { kind: 'connecting' } : { kind: 'no-notebook' }), notebook: action.path };
    case 'kernel-gone':
      return forKernel(state, state.notebook ? { kind: 'no-kernel' } : { kind: 'no-notebook' });
    case 'connecting':
      return forKernel(state, { kind: 'connecting' });
    case 'not-loaded':
      return forKernel(state, { kind: 'not-loaded' });
    case 'connected':
      return { ...state, connection: { kind: 'connected' }, error: null };
    case 'connection-error':
      return forKernel(state, { kind: 'error', message: action.message });
    case 'changed':
      return { ...state, version: Math.max(state.version, action.version) };
    case 'snapshot': {
      if (action.version < state.snapshotVersion) {
        return state; // an older snapshot that arrived late
      }
      // A card the snapshot shows answered needs no error of an earlier attempt.
      const cardErrors: Record<string, ErrorBody> = {};
      for (const [id, err] of Object.entries(state.cardErrors)) {
        const card = cardsOf(action.snapshot).find(c => c.id === id);
        if (card && !answeredOf(card)) {
          cardErrors[id] = err;
        }
      }
      // A plan that no longer waits needs neither its draft nor the error of an earlier attempt.
      const waitingPlans = new Set(plansOf(action.snapshot).map(p => p.task_id));
      const keep = <T>(byTask: Record<string, T>): Record<string, T> =>
        Object.fromEntries(Object.entries(byTask).filter(([id]) => waitingPlans.has(id)));
      return {
        ...state,
        connection: { kind: 'connected' },
        snapshot: action.snapshot,
        snapshotVersion: action.version,
        version: Math.max(state.version, action.version),
        cardErrors,
        planDrafts: keep(state.planDrafts),
        planReasons: keep(state.planReasons),
        planErrors: keep(state.planErrors),
        error: null
      };
    }
    case 'snapshot-failed':
      return { ...state, error: `${action.error.code}: ${action.error.message}` };
    case 'answer-sent':
      return { ...state, answering: { ...state.answering, [action.cardId]: action.answer } };
    case 'answer-done': {
      const { [action.cardId]: _done, ...answering } = state.answering;
      const { [action.cardId]: _err, ...cardErrors } = state.cardErrors;
      return { ...state, answering, cardErrors };
    }
    case 'answer-failed': {
      const { [action.cardId]: _done, ...answering } = state.answering;
      return { ...state, answering, cardErrors: { ...state.cardErrors, [action.cardId]: action.error } };
    }
    case 'plan-edit':
      return { ...state, planDrafts: { ...state.planDrafts, [action.taskId]: action.text } };
    case 'plan-reason':
      return { ...state, planReasons: { ...state.planReasons, [action.taskId]: action.text } };
    case 'plan-sent':
      return { ...state, planSending: { ...state.planSending, [action.taskId]: action.verdict } };
    case 'plan-done': {
      const { [action.taskId]: _done, ...planSending } = state.planSending;
      const { [action.taskId]: _err, ...planErrors } = state.planErrors;
      return { ...state, planSending, planErrors };
    }
    case 'plan-failed': {
      const { [action.taskId]: _done, ...planSending } = state.planSending;
      return { ...state, planSending, planErrors: { ...state.planErrors, [action.taskId]: action.error } };
    }
    case 'toggle-unfold':
      return { ...state, unfolded: { ...state.unfolded, [action.key]: !state.unfolded[action.key] } };
    case 'toggle-finished':
      return { ...state, showFinished: !state.showFinished };
    case 'open-run':
      if (state.openRun?.runId === action.runId) {
        return { ...state, openRun: null }; // a second click closes it
      }
      return { ...state, openRun: { runId: action.runId, entries: null, error: null } };
    case 'close-run':
      return { ...state, openRun: null };
    case 'entries':
      if (state.openRun?.runId !== action.runId) {
        return state;
      }
      return { ...state, openRun: { runId: action.runId, entries: action.entries, error: null } };
    case 'entries-failed':
      if (state.openRun?.runId !== action.runId) {
        return state;
      }
      return { ...state, openRun: { runId: action.runId, entries: [], error: `${action.error.code}: ${action.error.message}` } };
    case 'verify-start':
      return { ...state, verifying: true, verifyError: null };
    case 'verify-done': {
      const snapshot = state.snapshot
        ? { ...state.snapshot, journal: { ...state.snapshot.journal, verify: action.result } }
        : state.snapshot;
      return { ...state, verifying: false, snapshot };
    }
    case 'verify-failed':
      return { ...state, verifying: false, verifyError: `${action.error.code}: ${action.error.message}` };
  }
}

/** Who answered a card and when, whichever shape the kernel used; null while it waits. */
export function answeredOf(card: Card): Answered | null {
  if (card.answered) {
    return card.answered;
  }
  if (card.answer) {
    return { answer: card.answer, by: card.answered_by ?? null, at: card.answered_at ?? null };
  }
  return null;
}

export function askedAt(card: Card): string | null {
  return card.asked_at ?? card.created_at ?? null;
}

export function cardsOf(snapshot: Snapshot | null): Card[] {
  return (snapshot?.inbox ?? []).filter((i): i is Card => !isPlan(i));
}

export function plansOf(snapshot: Snapshot | null): PlanItem[] {
  return (snapshot?.inbox ?? []).filter(isPlan);
}

export function waitingCards(state: PanelState): Card[] {
  return cardsOf(state.snapshot).filter(c => !answeredOf(c));
}

/** Everything that waits on a person: the waiting cards, then the plans waiting for approval. */
export function waitingItems(state: PanelState): InboxItem[] {
  return [...waitingCards(state), ...plansOf(state.snapshot)];
}

/** One key per question, whichever kind (a plan's id is its task's). */
export function itemKey(item: InboxItem): string {
  return `${isPlan(item) ? 'plan' : 'card'}:${item.id}`;
}

/** The number on the panel's badge: every question that waits. */
export function badgeCount(state: PanelState): number {
  return waitingItems(state).length;
}

/** Questions waiting in `next` that were not waiting in `seen`: each gets one notification. */
export function newlyWaiting(seen: ReadonlySet<string>, next: PanelState): InboxItem[] {
  return waitingItems(next).filter(i => !seen.has(itemKey(i)));
}

/** Keys in `shown` (questions notified) that no longer wait in `next`: their notifications go. */
export function noLongerWaiting(shown: Iterable<string>, next: PanelState): string[] {
  const waiting = new Set(waitingItems(next).map(itemKey));
  return [...shown].filter(k => !waiting.has(k));
}

/** The steps of a plan as the panel will send them: the edited lines (trimmed, blank ones dropped),
 * or null when nothing was edited (then the plan runs as proposed). */
export function editedSteps(plan: PlanItem, draft: string | undefined): string[] | null {
  if (draft === undefined) {
    return null;
  }
  const steps = draft.split('\n').map(l => l.trim()).filter(l => l.length > 0);
  const same = steps.length === plan.steps.length && steps.every((s, i) => s === plan.steps[i].trim());
  return same ? null : steps;
}

/** A run's state in words a person reads. */
export function runStateWords(run: Run): string {
  if (run.awaiting_plan_approval) {
    return 'waiting for its plan to be approved';
  }
  if (run.status === 'waiting') {
    const n = run.waiting_cards ?? 0;
    return n > 0 ? `waiting for your answer (${n} question${n === 1 ? '' : 's'})` : 'waiting for a person (suspended)';
  }
  const words: Record<string, string> = {
    pending: 'starting', running: 'running', completed: 'completed', failed: 'failed', cancelled: 'cancelled',
    active: 'open: ready for a message', processing: 'replying', paused: 'paused: waiting for a person',
    closed: 'closed'
  };
  return words[run.status] ?? run.status;
}

/** The verification badge's state and words: never more than the verification checked. */
export function verifyWords(journal: Journal, verifying: boolean): { state: string; text: string } {
  const v = journal.verify;
  const size = journal.size;
  const checked = typeof v?.checked_size === 'number' ? v.checked_size : null;
  if (verifying || v?.state === 'running') {
    const sofar = checked !== null && checked > 0 && v?.first_bad_seq == null ? ` (${checked} of ${size} verified so far)` : '';
    return { state: 'running', text: `verifying…${sofar}` };
  }
  if (v?.state === 'failed') {
    const from = v.first_bad_seq !== undefined && v.first_bad_seq !== null ? ` from #${v.first_bad_seq}` : '';
    return { state: 'failed', text: `does NOT verify${from}` };
  }
  if (v?.state === 'ok' && checked !== null) {
    if (typeof size === 'number' && checked < size) {
      return { state: 'behind', text: `verified ${checked} of ${size} entries; the newer ones are checked next` };
    }
    return { state: 'ok', text: `verified: all ${checked} entries` };
  }
  return { state: 'unknown', text: 'not verified yet' };
}

const FINISHED = new Set(['done', 'completed', 'failed', 'cancelled', 'rejected', 'closed', 'expired', 'interrupted']);

export function runId(run: Run): string {
  return run.run_id ?? run.id ?? run.task_id ?? run.chat_id ?? '';
}

export function isFinished(run: Run): boolean {
  return Boolean(run.finished_at) || FINISHED.has(run.status);
}

export function splitRuns(runs: Run[]): { active: Run[]; finished: Run[] } {
  return { active: runs.filter(r => !isFinished(r)), finished: runs.filter(isFinished) };
}

/** Used and ceiling of a run's step budget, or null when it has none. */
export function budgetOf(run: Run): { used: number; max: number } | null {
  const b = run.budget;
  if (!b) {
    return null;
  }
  const max = b.max ?? b.ceiling;
  return typeof max === 'number' && max > 0 ? { used: b.used, max } : null;
}

/**
 * Which notification stands for which questions: a notification goes once none of its
 * questions waits any more (answered in the panel, in a cell, or anywhere else).
 */
export class NotificationBook {
  private readonly byNote = new Map<string, Set<string>>();

  add(noteId: string, keys: string[]): void {
    this.byNote.set(noteId, new Set(keys));
  }

  /** The notifications to dismiss now that `keys` no longer wait. */
  answered(keys: string[]): string[] {
    const done: string[] = [];
    for (const [note, waiting] of this.byNote) {
      for (const k of keys) {
        waiting.delete(k);
      }
      if (waiting.size === 0) {
        done.push(note);
        this.byNote.delete(note);
      }
    }
    return done;
  }
}
