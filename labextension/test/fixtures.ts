import { Card, Snapshot } from '../src/protocol';

export function card(over: Partial<Card> = {}): Card {
  return {
    id: 'pd-1',
    run_id: 'run-1',
    agent: 'clerk',
    tool: 'write_file',
    family: 'write',
    arguments: { path: 'notes/summary.txt', content: 'short' },
    answers: ['once', 'always', 'never'],
    reason: 'writing needs consent',
    line: 6,
    hints: null,
    asked_at: '2026-12-01T12:00:00Z',
    answered: null,
    ...over
  };
}

export function snapshot(over: Partial<Snapshot> = {}): Snapshot {
  return {
    mode: 'owner',
    home: '/tmp/home',
    server: null,
    kernel_agents_only: true,
    agents: [{ name: 'clerk', state: 'ready', inflight: 1 }],
    runs: [
      { id: 'task-1', run_id: 'run-1', kind: 'task', agent: 'clerk', status: 'waiting', title: 'Summarise the notes',
        budget: { used: 3, max: 10 }, step: 'Step 2 of 2: Write a summary file', waiting: true, finished_at: null },
      { id: 'task-0', run_id: 'run-0', kind: 'task', agent: 'clerk', status: 'completed', title: 'Earlier',
        budget: { used: 4, max: 10 }, step: null, waiting: false, finished_at: '2026-12-01T11:00:00Z' }
    ],
    inbox: [card()],
    journal: {
      size: 42, root: 'abcdef0123456789abcdef', last_checkpoint: { size: 40, root: 'ff', note: 'close' },
      verify: { state: 'ok', checked_size: 42 },
      latest: [{ seq: 42, kind: 'decision', run_id: 'run-1', payload: { tool: 'write_file', outcome: 'ask' } }]
    },
    ...over
  };
}
