/**
 * The panel's view state and the pure reducer that moves it: values in, values out.
 * Rendering (`render.ts`) reads a state; the shell (`panel.ts`) feeds actions in.
 */

import { Answered, Card, ErrorBody, JournalEntry, Run, Snapshot, VerifyResult } from './protocol';

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
        const card = action.snapshot.inbox.find(c => c.id === id);
        if (card && !answeredOf(card)) {
          cardErrors[id] = err;
        }
      }
      return {
        ...state,
        connection: { kind: 'connected' },
        snapshot: action.snapshot,
        snapshotVersion: action.version,
        version: Math.max(state.version, action.version),
        cardErrors,
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

export function waitingCards(state: PanelState): Card[] {
  return (state.snapshot?.inbox ?? []).filter(c => !answeredOf(c));
}

/** The number on the panel's badge. */
export function badgeCount(state: PanelState): number {
  return waitingCards(state).length;
}

/** Cards waiting in `next` that were not waiting in `seen`: each gets one notification. */
export function newlyWaiting(seen: ReadonlySet<string>, next: PanelState): Card[] {
  return waitingCards(next).filter(c => !seen.has(c.id));
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
