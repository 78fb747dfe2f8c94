/**
 * The comm protocol the panel speaks with the kernel's `apollia.panel` comm target.
 *
 * Front → kernel: `{id, op, ...}` with op `snapshot`, `answer`, `entries`, `verify`,
 * `approve_plan` (`task_id`, `steps` as edited or absent) or `reject_plan` (`task_id`, `reason`).
 * Kernel → front: replies `{id, ok: true, data}` / `{id, ok: false, error: {code, message}}`,
 * and pushes `{event: "changed", version}` whenever something the panel shows changed.
 *
 * `PanelClient` pairs requests with replies over any comm-like object, so the same code
 * runs over a JupyterLab `IComm` and over a fake one in the unit tests.
 */

export const COMM_TARGET = 'apollia.panel';

/** How long a request waits for its reply before it fails with `PANEL_TIMEOUT`. */
export const DEFAULT_TIMEOUT_MS = 30_000;

export type VerifyState = 'ok' | 'failed' | 'unknown' | 'running';

export interface Budget {
  used: number;
  max?: number;
  ceiling?: number;
}

export interface Answered {
  answer: string;
  by: string | null;
  at: string | null;
}

/** A waiting (or answered) decision, as the kernel sends it. */
export interface Card {
  kind?: 'card';
  id: string;
  /** The goal of the task (or the first message of the chat) the card belongs to. */
  goal?: string | null;
  /** Whose card it is: a task's or a chat's. */
  owner?: 'task' | 'chat' | null;
  run_id?: string;
  task_id?: string | null;
  session_id?: string | null;
  agent: string;
  tool: string;
  family: string | null;
  arguments: Record<string, unknown>;
  answers: string[];
  reason?: string;
  line?: number | string | null;
  hints?: Record<string, unknown> | null;
  asked_at?: string;
  created_at?: string;
  answered?: Answered | null;
  answer?: string | null;
  answered_by?: string | null;
  answered_at?: string | null;
  /** The digest of the call as shown: what an answer approves. */
  digest?: string;
  /** Who may answer it (the policy's four eyes and approvers); null when governance cannot be read. */
  may_answer?: MayAnswer | null;
  /** What the person at this panel may answer, and why not the rest (null: every answer on offer). */
  you?: { answers: string[]; why: string | null };
}

export interface MayAnswer {
  roles: string[];
  four_eyes: boolean;
  started_by: string | null;
  excluded: string[];
  approvers: number;
  approved_by: string[];
  approvals_needed: number;
}

/** Who answers from this panel, as four eyes counts them. */
export interface Me {
  name: string;
  role: string;
  auth: string;
}

/** A task waiting for its plan to be approved, as the kernel sends it in the inbox. */
export interface PlanItem {
  kind: 'plan';
  id: string;
  task_id: string;
  run_id: string;
  agent: string;
  goal: string;
  steps: string[];
  asked_at?: string | null;
  runs?: string;
}

export type InboxItem = Card | PlanItem;

export function isPlan(item: InboxItem): item is PlanItem {
  return item.kind === 'plan';
}

export interface Agent {
  name: string;
  state: string;
  description?: string;
  model?: string | null;
  inflight?: number;
}

/** The reasoning of a run's last step that has any, folded in its row (opaque parts read "[redacted reasoning]"). */
export interface RunReasoning {
  step: number;
  text: string;
  /** The whole reasoning's length: `text` holds at most the first few thousand characters. */
  chars: number;
}

export interface Run {
  id?: string;
  run_id?: string;
  task_id?: string | null;
  chat_id?: string | null;
  kind: string;
  agent: string;
  status: string;
  goal?: string;
  title?: string;
  budget?: Budget | null;
  step?: string | null;
  reasoning?: RunReasoning | null;
  waiting?: boolean;
  waiting_cards?: number;
  awaiting_plan_approval?: boolean;
  finished_at?: string | null;
}

export interface JournalEntry {
  seq: number;
  kind?: string;
  type?: string;
  run_id?: string | null;
  at?: string;
  ts?: string;
  summary?: string;
  [key: string]: unknown;
}

export interface VerifyResult {
  state: VerifyState;
  checked_size?: number;
  first_bad_seq?: number | null;
  message?: string;
}

export interface Journal {
  size: number;
  root: string | null;
  last_checkpoint: unknown;
  verify?: VerifyResult | null;
  latest: JournalEntry[];
}

export interface Problem {
  part: string;
  code: string;
  message: string;
}

export interface Snapshot {
  mode: 'owner' | 'served';
  home: string;
  server: string | null;
  user?: string;
  me?: Me;
  /** The change counter the pushes carry, as of this snapshot. */
  version?: number;
  kernel_agents_only?: boolean;
  problems?: Problem[];
  agents: Agent[];
  runs: Run[];
  inbox: InboxItem[];
  journal: Journal;
}

export interface ErrorBody {
  code: string;
  message: string;
  [key: string]: unknown;
}

export interface Reply {
  id: string;
  ok: boolean;
  data?: unknown;
  error?: ErrorBody;
}

export interface ChangedPush {
  event: 'changed';
  version: number;
}

/** A request that failed: the kernel's error code and message, or the panel's own. */
export class PanelError extends Error {
  readonly code: string;
  readonly body: ErrorBody;
  constructor(body: ErrorBody) {
    super(`${body.code}: ${body.message}`);
    this.code = body.code;
    this.body = body;
  }
}

/** What the client needs of a comm: send data, and be told of messages and of the close. */
export interface CommLike {
  send(data: Record<string, unknown>): void;
  close(): void;
}

interface Pending {
  resolve: (data: unknown) => void;
  reject: (err: PanelError) => void;
  timer: ReturnType<typeof setTimeout>;
}

/** Requests over one comm, each answered by the reply that carries its id. */
export class PanelClient {
  private readonly pending = new Map<string, Pending>();
  private counter = 0;
  private closed = false;

  constructor(
    private readonly comm: CommLike,
    private readonly onChanged: (version: number) => void,
    private readonly timeoutMs: number = DEFAULT_TIMEOUT_MS,
    private readonly prefix: string = `p${Math.random().toString(36).slice(2, 8)}`
  ) {}

  /** Feed every message the comm receives here (its `data`). */
  handle(data: unknown): void {
    if (!data || typeof data !== 'object') {
      return;
    }
    const msg = data as Partial<Reply & ChangedPush>;
    if (msg.event === 'changed') {
      this.onChanged(typeof msg.version === 'number' ? msg.version : 0);
      return;
    }
    if (typeof msg.id !== 'string') {
      return;
    }
    const pending = this.pending.get(msg.id);
    if (!pending) {
      return; // a reply to a request that already timed out
    }
    this.pending.delete(msg.id);
    clearTimeout(pending.timer);
    if (msg.ok) {
      pending.resolve(msg.data);
    } else {
      pending.reject(
        new PanelError(msg.error ?? { code: 'PANEL_BAD_REPLY', message: 'the kernel replied without an error body' })
      );
    }
  }

  /** The comm closed (kernel restarted, extension unloaded): every waiting request fails. */
  handleClose(): void {
    this.closed = true;
    for (const [id, pending] of this.pending) {
      clearTimeout(pending.timer);
      pending.reject(new PanelError({ code: 'PANEL_CLOSED', message: 'the kernel closed the panel connection' }));
      this.pending.delete(id);
    }
  }

  get isClosed(): boolean {
    return this.closed;
  }

  request<T = unknown>(op: string, args: Record<string, unknown> = {}): Promise<T> {
    if (this.closed) {
      return Promise.reject(new PanelError({ code: 'PANEL_CLOSED', message: 'the panel connection is closed' }));
    }
    const id = `${this.prefix}-${++this.counter}`;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new PanelError({ code: 'PANEL_TIMEOUT', message: `the kernel did not answer "${op}" in ${this.timeoutMs / 1000} s` }));
      }, this.timeoutMs);
      this.pending.set(id, { resolve: resolve as (d: unknown) => void, reject, timer });
      try {
        this.comm.send({ ...args, id, op });
      } catch (err) {
        clearTimeout(timer);
        this.pending.delete(id);
        reject(new PanelError({ code: 'PANEL_CLOSED', message: String(err) }));
      }
    });
  }

  snapshot(): Promise<Snapshot> {
    return this.request<Snapshot>('snapshot');
  }

  /** `lasting` (with `always`): how long the standing consent lasts, sent as `for` ("8h"). */
  answer(cardId: string, answer: string, lasting?: string): Promise<unknown> {
    return this.request('answer', lasting ? { card_id: cardId, answer, for: lasting } : { card_id: cardId, answer });
  }

  /** Approve a plan as proposed (`steps` null) or as edited. */
  approvePlan(taskId: string, steps: string[] | null): Promise<unknown> {
    return this.request('approve_plan', steps === null ? { task_id: taskId } : { task_id: taskId, steps });
  }

  rejectPlan(taskId: string, reason: string): Promise<unknown> {
    return this.request('reject_plan', { task_id: taskId, reason });
  }

  entries(runId: string, limit = 50): Promise<JournalEntry[]> {
    return this.request<unknown>('entries', { run_id: runId, limit }).then(data =>
      Array.isArray(data) ? (data as JournalEntry[]) : ((data as { entries?: JournalEntry[] })?.entries ?? [])
    );
  }

  verify(): Promise<VerifyResult> {
    return this.request<VerifyResult>('verify');
  }

  close(): void {
    this.handleClose();
    try {
      this.comm.close();
    } catch {
      // already closed by the kernel
    }
  }
}
