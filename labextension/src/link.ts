/**
 * The panel's link to one kernel: opens the `apollia.panel` comm on a kernel subshell,
 * turns replies and pushes into reducer actions, and coalesces snapshot requests.
 *
 * JupyterLab 4.6 sends a comm's messages over a kernel subshell (one per comm target) when
 * the kernel supports subshells (ipykernel 7): the kernel handles them on the subshell's
 * thread while its main shell runs a cell, which is what lets an answer through while a
 * cell does `await task`. The link makes sure of it: it turns subshells on for its own comm
 * when the connection has them off, and waits for the subshell before it sends anything,
 * because a message sent before the subshell exists goes to the main shell and waits there.
 */

import { Action } from './state';
import { COMM_TARGET, CommLike, ErrorBody, PanelClient, PanelError, Snapshot } from './protocol';

export const PER_COMM_TARGET = 'perCommTarget';
export const DISABLED = 'disabled';

/** What the link needs of a JupyterLab comm (`Kernel.IComm`). */
export interface KernelComm extends CommLike {
  open(data?: Record<string, unknown>): unknown;
  onMsg: (msg: { content: { data: unknown } }) => void;
  onClose: (msg: unknown) => void;
  commsOverSubshells: string;
  subshellStarted: Promise<void>;
  readonly subshellId: string | null;
}

/** What the link needs of a JupyterLab kernel connection (`Kernel.IKernelConnection`). */
export interface KernelLike {
  readonly info: Promise<unknown>;
  readonly supportsSubshells: boolean;
  readonly commsOverSubshells?: string;
  createComm(target: string): KernelComm;
}

export type Dispatch = (action: Action) => void;

/** Whether the last connection goes over a subshell, for the panel's footnote and the docs. */
export interface LinkInfo {
  subshell: boolean;
}

export class KernelLink {
  private client: PanelClient | null = null;
  private inflight = false;
  private dirty = false;
  private disposed = false;
  private ready = false;
  /**
   * Snapshot requests are numbered by the link (the kernel's change counter starts again
   * when its home is reopened): the panel never replaces a snapshot by one asked earlier.
   */
  private requested = 0;
  info: LinkInfo = { subshell: false };

  constructor(
    private readonly kernel: KernelLike,
    private readonly dispatch: Dispatch,
    private readonly timeoutMs?: number,
    private readonly subshellTimeoutMs = 10_000
  ) {}

  get connected(): boolean {
    return this.client !== null && !this.client.isClosed;
  }

  /** Opens the comm and fetches the first snapshot; dispatches `not-loaded` when the kernel has no such target. */
  async connect(): Promise<void> {
    this.dispatch({ type: 'connecting' });
    try {
      await this.kernel.info;
    } catch (err) {
      this.dispatch({ type: 'connection-error', message: `the kernel did not answer: ${String(err)}` });
      return;
    }
    if (this.disposed) {
      return;
    }
    const comm = this.kernel.createComm(COMM_TARGET);
    if (this.kernel.supportsSubshells) {
      if (comm.commsOverSubshells === DISABLED) {
        comm.commsOverSubshells = PER_COMM_TARGET;
      }
      const started = await Promise.race([
        comm.subshellStarted.then(() => true, () => false),
        new Promise<boolean>(resolve => setTimeout(() => resolve(false), this.subshellTimeoutMs))
      ]);
      this.info = { subshell: started && comm.subshellId !== null };
    } else {
      this.info = { subshell: false };
    }
    if (this.disposed) {
      comm.close();
      return;
    }
    const client = new PanelClient(comm, version => this.onChanged(version), this.timeoutMs);
    comm.onMsg = msg => client.handle(msg.content.data);
    comm.onClose = () => {
      const wasReady = this.client === client && this.ready;
      client.handleClose();
      if (wasReady && !this.disposed) {
        this.client = null;
        this.dispatch({ type: 'kernel-gone' });
      }
    };
    this.client = client;
    comm.open({});
    let snapshot: Snapshot;
    const first = ++this.requested;
    try {
      snapshot = await client.snapshot();
    } catch (err) {
      const body = errorBody(err);
      this.client = null;
      if (body.code === 'PANEL_CLOSED') {
        this.dispatch({ type: 'not-loaded' });
      } else if (body.code.startsWith('PANEL_')) {
        client.close();
        this.dispatch({ type: 'connection-error', message: `${body.code}: ${body.message}` });
      } else {
        // The kernel answered with an error of its own (say, no home is open yet): the comm
        // is open, and its next change notice brings the snapshot.
        this.client = client;
        this.ready = true;
        this.dispatch({ type: 'connected' });
        this.dispatch({ type: 'snapshot-failed', error: body });
      }
      return;
    }
    this.ready = true;
    this.dispatch({ type: 'connected' });
    this.dispatch({ type: 'snapshot', snapshot, version: first });
  }

  /** A `changed` push: fetch a new snapshot, at most one request at a time. */
  private onChanged(version: number): void {
    this.dispatch({ type: 'changed', version });
    void this.refresh();
  }

  async refresh(): Promise<void> {
    const client = this.client;
    if (!client) {
      return;
    }
    if (this.inflight) {
      this.dirty = true;
      return;
    }
    this.inflight = true;
    try {
      do {
        this.dirty = false;
        const version = ++this.requested;
        try {
          const snapshot = await client.snapshot();
          this.dispatch({ type: 'snapshot', snapshot, version });
        } catch (err) {
          this.dispatch({ type: 'snapshot-failed', error: errorBody(err) });
        }
      } while (this.dirty && !client.isClosed);
    } finally {
      this.inflight = false;
    }
  }

  async answer(cardId: string, answer: string, lasting?: string): Promise<void> {
    const client = this.client;
    if (!client) {
      this.dispatch({ type: 'answer-failed', cardId, error: { code: 'PANEL_CLOSED', message: 'not connected to the kernel' } });
      return;
    }
    this.dispatch({ type: 'answer-sent', cardId, answer });
    try {
      await client.answer(cardId, answer, lasting);
      this.dispatch({ type: 'answer-done', cardId });
    } catch (err) {
      this.dispatch({ type: 'answer-failed', cardId, error: errorBody(err) });
    }
    await this.refresh();
  }

  /** Approve a plan (`steps`: as edited, or null: as proposed) or reject it with a reason. */
  async answerPlan(taskId: string, verdict: 'approve' | 'reject', steps: string[] | null, reason: string): Promise<void> {
    const client = this.client;
    if (!client) {
      this.dispatch({ type: 'plan-failed', taskId, error: { code: 'PANEL_CLOSED', message: 'not connected to the kernel' } });
      return;
    }
    this.dispatch({ type: 'plan-sent', taskId, verdict });
    try {
      await (verdict === 'approve' ? client.approvePlan(taskId, steps) : client.rejectPlan(taskId, reason));
      this.dispatch({ type: 'plan-done', taskId });
    } catch (err) {
      this.dispatch({ type: 'plan-failed', taskId, error: errorBody(err) });
    }
    await this.refresh();
  }

  async entries(runId: string, limit = 50): Promise<void> {
    const client = this.client;
    if (!client) {
      return;
    }
    try {
      this.dispatch({ type: 'entries', runId, entries: await client.entries(runId, limit) });
    } catch (err) {
      this.dispatch({ type: 'entries-failed', runId, error: errorBody(err) });
    }
  }

  async verify(): Promise<void> {
    const client = this.client;
    if (!client) {
      return;
    }
    this.dispatch({ type: 'verify-start' });
    try {
      this.dispatch({ type: 'verify-done', result: await client.verify() });
    } catch (err) {
      this.dispatch({ type: 'verify-failed', error: errorBody(err) });
    }
  }

  dispose(): void {
    this.disposed = true;
    const client = this.client;
    this.client = null;
    client?.close();
  }
}

export function errorBody(err: unknown): ErrorBody {
  if (err instanceof PanelError) {
    return err.body;
  }
  return { code: 'PANEL_ERROR', message: String(err) };
}
