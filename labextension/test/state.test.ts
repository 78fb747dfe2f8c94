import { describe, expect, it } from 'vitest';
import { answeredOf, badgeCount, budgetOf, initialState, newlyWaiting, reduce, splitRuns, waitingCards } from '../src/state';
import { card, snapshot } from './fixtures';

const connected = reduce(reduce(initialState, { type: 'notebook', path: 'a.ipynb' }), { type: 'connected' });

describe('reduce', () => {
  it('a snapshot shows the waiting cards and the badge counts them', () => {
    const s = reduce(connected, { type: 'snapshot', snapshot: snapshot({ inbox: [card(), card({ id: 'pd-2' }),
      card({ id: 'pd-3', answered: { answer: 'once', by: 'ann', at: '2026-12-01T12:01:00Z' } })] }), version: 1 });
    expect(waitingCards(s).map(c => c.id)).toEqual(['pd-1', 'pd-2']);
    expect(badgeCount(s)).toBe(2);
  });

  it('an older snapshot arriving late does not replace a newer one', () => {
    const newer = reduce(connected, { type: 'snapshot', snapshot: snapshot({ inbox: [] }), version: 5 });
    const late = reduce(newer, { type: 'snapshot', snapshot: snapshot(), version: 3 });
    expect(late).toBe(newer);
    expect(badgeCount(late)).toBe(0);
  });

  it('an answer in flight, then done, then a failed one keeps its error until the card shows answered', () => {
    let s = reduce(connected, { type: 'snapshot', snapshot: snapshot(), version: 1 });
    s = reduce(s, { type: 'answer-sent', cardId: 'pd-1', answer: 'once' });
    expect(s.answering).toEqual({ 'pd-1': 'once' });
    s = reduce(s, { type: 'answer-failed', cardId: 'pd-1', error: { code: 'CONFLICT', message: 'answered by bob' } });
    expect(s.answering).toEqual({});
    expect(s.cardErrors['pd-1'].code).toBe('CONFLICT');
    // Still waiting in the next snapshot: the error stays.
    s = reduce(s, { type: 'snapshot', snapshot: snapshot(), version: 2 });
    expect(s.cardErrors['pd-1'].code).toBe('CONFLICT');
    // Answered in the next one (by bob): the card is frozen and the error goes.
    s = reduce(s, { type: 'snapshot', snapshot: snapshot({ inbox: [card({ answered: { answer: 'never', by: 'bob', at: null } })] }), version: 3 });
    expect(s.cardErrors).toEqual({});
    expect(answeredOf(s.snapshot!.inbox[0])).toEqual({ answer: 'never', by: 'bob', at: null });
  });

  it('a kernel change forgets the previous kernel: snapshot, answers in flight, the open run', () => {
    let s = reduce(connected, { type: 'snapshot', snapshot: snapshot(), version: 4 });
    s = reduce(s, { type: 'answer-sent', cardId: 'pd-1', answer: 'once' });
    s = reduce(s, { type: 'open-run', runId: 'run-1' });
    s = reduce(s, { type: 'kernel-gone' });
    expect(s.connection).toEqual({ kind: 'no-kernel' });
    expect(s.snapshot).toBeNull();
    expect(s.answering).toEqual({});
    expect(s.openRun).toBeNull();
    expect(s.snapshotVersion).toBe(0);
    expect(reduce(s, { type: 'notebook', path: null }).connection).toEqual({ kind: 'no-notebook' });
  });

  it('opening a run waits for its entries; entries of another run are ignored; a second click closes it', () => {
    let s = reduce(connected, { type: 'open-run', runId: 'run-1' });
    expect(s.openRun).toEqual({ runId: 'run-1', entries: null, error: null });
    s = reduce(s, { type: 'entries', runId: 'run-9', entries: [{ seq: 1 }] });
    expect(s.openRun!.entries).toBeNull();
    s = reduce(s, { type: 'entries', runId: 'run-1', entries: [{ seq: 7 }] });
    expect(s.openRun!.entries).toEqual([{ seq: 7 }]);
    expect(reduce(s, { type: 'open-run', runId: 'run-1' }).openRun).toBeNull();
    const failed = reduce(reduce(connected, { type: 'open-run', runId: 'run-2' }),
      { type: 'entries-failed', runId: 'run-2', error: { code: 'UNKNOWN_RUN', message: 'no run run-2' } });
    expect(failed.openRun!.error).toBe('UNKNOWN_RUN: no run run-2');
  });

  it('verification: running, then its result replaces the badge state; a failure is kept apart', () => {
    let s = reduce(connected, { type: 'snapshot', snapshot: snapshot(), version: 1 });
    s = reduce(s, { type: 'verify-start' });
    expect(s.verifying).toBe(true);
    s = reduce(s, { type: 'verify-done', result: { state: 'failed', checked_size: 42, first_bad_seq: 17 } });
    expect(s.verifying).toBe(false);
    expect(s.snapshot!.journal.verify).toEqual({ state: 'failed', checked_size: 42, first_bad_seq: 17 });
    s = reduce(s, { type: 'verify-failed', error: { code: 'PANEL_TIMEOUT', message: 'slow' } });
    expect(s.verifyError).toBe('PANEL_TIMEOUT: slow');
  });
});

describe('selectors', () => {
  it('newlyWaiting names only the cards not seen before', () => {
    const s = reduce(connected, { type: 'snapshot', snapshot: snapshot({ inbox: [card(), card({ id: 'pd-2' })] }), version: 1 });
    expect(newlyWaiting(new Set(['card:pd-1']), s).map(c => c.id)).toEqual(['pd-2']);
    expect(newlyWaiting(new Set(['card:pd-1', 'card:pd-2']), s)).toEqual([]);
  });

  it('answeredOf reads both the nested and the flat shape', () => {
    expect(answeredOf(card({ answered: null, answer: 'always', answered_by: 'ann', answered_at: 't' })))
      .toEqual({ answer: 'always', by: 'ann', at: 't' });
    expect(answeredOf(card())).toBeNull();
  });

  it('runs split into active and finished; budgets read max or ceiling', () => {
    const { active, finished } = splitRuns(snapshot().runs);
    expect(active.map(r => r.id)).toEqual(['task-1']);
    expect(finished.map(r => r.id)).toEqual(['task-0']);
    expect(budgetOf(active[0])).toEqual({ used: 3, max: 10 });
    expect(budgetOf({ kind: 'task', agent: 'a', status: 'running', budget: { used: 1, ceiling: 5 } })).toEqual({ used: 1, max: 5 });
    expect(budgetOf({ kind: 'chat', agent: 'a', status: 'idle', budget: null })).toBeNull();
  });
});
