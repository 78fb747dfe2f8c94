/**
 * The side panel widget: holds the view state, follows the current notebook's kernel,
 * renders on every change, counts waiting cards on its tab and raises a notification
 * when a new card waits.
 */

import { Widget } from '@lumino/widgets';
import { ISessionContext } from '@jupyterlab/apputils';
import { Kernel, KernelMessage } from '@jupyterlab/services';

import { KernelLike, KernelLink } from './link';
import { renderPanel, Handlers } from './render';
import {
  Action, PanelState, badgeCount, editedSteps, initialState, itemKey, newlyWaiting, noLongerWaiting, plansOf, reduce,
  waitingItems
} from './state';
import { COMM_TARGET, InboxItem } from './protocol';

export interface PanelOptions {
  /** Called once per question (card or plan) that starts waiting (for the JupyterLab notification). */
  notify?: (items: InboxItem[]) => void;
  /** Called with the keys (`itemKey`) of notified questions that no longer wait (answered anywhere). */
  dismiss?: (keys: string[]) => void;
  /** Called with the count of waiting cards whenever it changes (for the tab's badge). */
  badge?: (count: number) => void;
  /** The clock, for ages. */
  now?: () => number;
}

/** Statuses after which the kernel's comms are gone. */
const GONE = new Set(['restarting', 'autorestarting', 'dead', 'terminating', 'unknown']);

export class ApolliaPanel extends Widget {
  private _state: PanelState = initialState;
  private link: KernelLink | null = null;
  private context: ISessionContext | null = null;
  private seen = new Set<string>();
  /** Questions notified that still wait: their notification goes when they stop waiting. */
  private notified = new Set<string>();
  private cellRan = false;
  private announced: Kernel.IKernelConnection | null = null;
  private lastBadge = -1;
  private tick: ReturnType<typeof setInterval> | null = null;
  private readonly handlers: Handlers;

  /** The lifetime chosen beside each card's `always` (kept across renders; '' until revoked). */
  private lifetimes: Record<string, string> = {};

  constructor(private readonly options: PanelOptions = {}) {
    super();
    this.id = 'apollia-panel';
    this.addClass('apollia-panel');
    this.node.setAttribute('role', 'region');
    this.node.setAttribute('aria-label', 'apollia: inbox, agents and runs, journal');
    this.node.tabIndex = -1;
    this.handlers = {
      answer: (cardId, answer) => void this.link?.answer(cardId, answer,
        answer === 'always' ? this.lifetimes[cardId] || undefined : undefined),
      chooseLifetime: (cardId, lifetime) => { this.lifetimes[cardId] = lifetime; },
      lifetimeOf: cardId => this.lifetimes[cardId] ?? '',
      approvePlan: taskId => {
        const plan = plansOf(this._state.snapshot).find(p => p.task_id === taskId);
        if (plan) {
          const steps = editedSteps(plan, this._state.planDrafts[taskId]);
          if (steps !== null && steps.length === 0) {
            this.dispatch({ type: 'plan-failed', taskId, error: { code: 'BAD_INPUT', message: 'a plan needs at least one step' } });
            return;
          }
          void this.link?.answerPlan(taskId, 'approve', steps, '');
        }
      },
      rejectPlan: taskId => void this.link?.answerPlan(taskId, 'reject', null, this._state.planReasons[taskId] ?? ''),
      // Typing changes the state but not the page: a new render would replace the field being typed in.
      editPlan: (taskId, text) => { this._state = reduce(this._state, { type: 'plan-edit', taskId, text }); },
      editReason: (taskId, text) => { this._state = reduce(this._state, { type: 'plan-reason', taskId, text }); },
      toggleUnfold: key => this.dispatch({ type: 'toggle-unfold', key }),
      toggleFinished: () => this.dispatch({ type: 'toggle-finished' }),
      openRun: runId => {
        this.dispatch({ type: 'open-run', runId });
        if (this._state.openRun?.runId === runId) {
          void this.link?.entries(runId);
        }
      },
      verify: () => void this.link?.verify(),
      refresh: () => void this.reconnect()
    };
    this.render();
    // Ages move on without a change in the kernel.
    this.tick = setInterval(() => {
      if (this.isVisible && this._state.snapshot) {
        this.render();
      }
    }, 15_000);
  }

  get state(): PanelState {
    return this._state;
  }

  dispatch(action: Action): void {
    const before = this._state;
    this._state = reduce(before, action);
    if (action.type === 'snapshot' && this._state !== before) {
      const fresh = newlyWaiting(this.seen, this._state);
      for (const item of waitingItems(this._state)) {
        this.seen.add(itemKey(item));
      }
      const gone = noLongerWaiting(this.notified, this._state);
      for (const key of gone) {
        this.notified.delete(key);
      }
      if (gone.length) {
        this.options.dismiss?.(gone);
      }
      if (fresh.length && this.options.notify) {
        for (const item of fresh) {
          this.notified.add(itemKey(item));
        }
        this.options.notify(fresh);
      }
    } else if (this._state.snapshot === null && this.notified.size) {
      // Another kernel (or none): what was notified for this one is not answerable here.
      const gone = [...this.notified];
      this.notified.clear();
      this.options.dismiss?.(gone);
    }
    const count = badgeCount(this._state);
    if (count !== this.lastBadge) {
      this.lastBadge = count;
      this.options.badge?.(count);
    }
    this.render();
  }

  /** Follow another notebook's session (null: no notebook is current). */
  follow(context: ISessionContext | null, path: string | null): void {
    if (context === this.context) {
      return;
    }
    if (this.context) {
      this.context.kernelChanged.disconnect(this.onKernelChanged, this);
      this.context.statusChanged.disconnect(this.onStatus, this);
      this.context.iopubMessage.disconnect(this.onIopub, this);
    }
    this.dropLink();
    this.context = context;
    this.dispatch({ type: 'notebook', path: context ? path : null });
    if (!context) {
      return;
    }
    context.kernelChanged.connect(this.onKernelChanged, this);
    context.statusChanged.connect(this.onStatus, this);
    context.iopubMessage.connect(this.onIopub, this);
    void context.ready.then(() => {
      if (this.context === context) {
        void this.reconnect();
      }
    });
  }

  private onKernelChanged(): void {
    void this.reconnect();
  }

  /** A cell ran: once the kernel is idle again, a kernel without the extension may have loaded it. */
  private onIopub(_: ISessionContext, msg: KernelMessage.IMessage): void {
    if (msg.header.msg_type === 'execute_input') {
      this.cellRan = true;
    }
  }

  private onStatus(_: ISessionContext, status: Kernel.Status): void {
    if (GONE.has(status)) {
      if (this.link) {
        this.dropLink();
        this.dispatch({ type: 'kernel-gone' });
      }
      return;
    }
    if (status !== 'idle') {
      return;
    }
    // After a restart, try again; without the extension, try again only after a cell ran (it
    // may have run `%load_ext apollia_nb`): the panel's own messages make the kernel busy and
    // idle too, and must not start a loop of attempts.
    const kind = this._state.connection.kind;
    if (kind === 'no-kernel' || (kind === 'not-loaded' && this.cellRan)) {
      this.cellRan = false;
      void this.reconnect();
    } else if (kind === 'connected' && !this._state.snapshot && this.cellRan) {
      this.cellRan = false; // e.g. the home was not open yet: ask again
      void this.link?.refresh();
    }
  }

  private dropLink(): void {
    this.link?.dispose();
    this.link = null;
  }

  /**
   * `%load_ext apollia_nb` announces the target by opening a comm to the front end's
   * `apollia.panel` target with `{"event": "loaded"}`: connect at once when not connected.
   */
  private listen(kernel: Kernel.IKernelConnection): void {
    if (this.announced === kernel) {
      return;
    }
    this.announced = kernel;
    kernel.registerCommTarget(COMM_TARGET, (_comm, msg) => {
      const data = msg.content.data as { event?: string } | undefined;
      const kind = this._state.connection.kind;
      if (data?.event === 'loaded' && this.context?.session?.kernel === kernel && kind !== 'connected' && kind !== 'connecting') {
        void this.reconnect();
      }
    });
  }

  async reconnect(): Promise<void> {
    this.dropLink();
    const kernel = this.context?.session?.kernel ?? null;
    if (!kernel) {
      this.dispatch({ type: 'kernel-gone' });
      return;
    }
    this.listen(kernel);
    const link = new KernelLink(kernel as unknown as KernelLike, action => {
      if (this.link === link) {
        this.dispatch(action);
      }
    });
    this.link = link;
    await link.connect();
  }

  /** Whether the current connection goes over a kernel subshell. */
  get overSubshell(): boolean {
    return this.link?.info.subshell ?? false;
  }

  private render(): void {
    const body = renderPanel(this._state, this.handlers, this.options.now ? this.options.now() : Date.now(), this.node.ownerDocument);
    if (this._state.connection.kind === 'connected' && this.link && !this.link.info.subshell) {
      body.append(Object.assign(this.node.ownerDocument.createElement('p'), {
        className: 'apollia-note',
        textContent: 'This kernel has no subshells: answers given here wait until the running cell ends.'
      }));
    }
    // Keep the focused control focused across renders (keyboard use).
    const active = this.node.ownerDocument.activeElement as HTMLElement | null;
    const key = active && this.node.contains(active) ? focusKey(active) : null;
    const field = active instanceof HTMLTextAreaElement || active instanceof HTMLInputElement ? active : null;
    const caret = field ? [field.selectionStart, field.selectionEnd] : null;
    this.node.replaceChildren(body);
    if (key) {
      const again = this.node.querySelector<HTMLElement>(key);
      again?.focus();
      if (caret && (again instanceof HTMLTextAreaElement || again instanceof HTMLInputElement)) {
        again.setSelectionRange(caret[0], caret[1]);
      }
    }
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    if (this.tick) {
      clearInterval(this.tick);
    }
    this.follow(null, null);
    super.dispose();
  }
}

/** A selector that finds the same control after a render. */
function focusKey(el: HTMLElement): string | null {
  const card = el.closest('[data-card-id]')?.getAttribute('data-card-id');
  const plan = el.closest('[data-plan-id]')?.getAttribute('data-plan-id');
  const run = el.closest('[data-run-id]')?.getAttribute('data-run-id');
  const label = el.getAttribute('aria-label');
  const scope = card ? `[data-card-id="${CSS.escape(card)}"] `
    : plan ? `[data-plan-id="${CSS.escape(plan)}"] `
      : run ? `[data-run-id="${CSS.escape(run)}"] ` : '';
  if (label) {
    return `${scope}[aria-label="${CSS.escape(label)}"]`;
  }
  return null;
}
