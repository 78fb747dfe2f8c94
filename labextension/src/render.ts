/**
 * Renders a `PanelState` into DOM: a pure function of the state, the clock and the handlers.
 * Only JupyterLab CSS variables colour it (style/base.css), so it follows the light and dark
 * themes; every control is a real button, so it is keyboard operable, and labelled for
 * screen readers.
 */

import { fold, valueText, age, clock, shortHash } from './format';
import { Agent, Card, JournalEntry, PlanItem, Run } from './protocol';
import {
  PanelState, answeredOf, askedAt, budgetOf, cardsOf, plansOf, runId, runStateWords, splitRuns, verifyWords,
  waitingCards
} from './state';

export interface Handlers {
  answer(cardId: string, answer: string): void;
  /** How long a card's `always` lasts ('' until revoked, else its `for`: 1h, 8h, 24h): chosen, and as chosen. */
  chooseLifetime?(cardId: string, lifetime: string): void;
  lifetimeOf?(cardId: string): string;
  /** Approve a plan: as edited in the panel, or as proposed. */
  approvePlan(taskId: string): void;
  rejectPlan(taskId: string): void;
  /** Typing in a plan's steps or reason (kept in the state; no new render needed). */
  editPlan(taskId: string, text: string): void;
  editReason(taskId: string, text: string): void;
  toggleUnfold(key: string): void;
  toggleFinished(): void;
  openRun(runId: string): void;
  verify(): void;
  refresh(): void;
}

type Child = Node | string | null | undefined | false;

function h(doc: Document, tag: string, attrs: Record<string, string | undefined> = {}, ...children: Child[]): HTMLElement {
  const el = doc.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== undefined) {
      el.setAttribute(k, v);
    }
  }
  for (const c of children) {
    if (c === null || c === undefined || c === false) {
      continue;
    }
    el.append(typeof c === 'string' ? doc.createTextNode(c) : c);
  }
  return el;
}

function button(doc: Document, label: string, onClick: () => void, attrs: Record<string, string | undefined> = {}): HTMLElement {
  const b = h(doc, 'button', { type: 'button', class: 'apollia-button', ...attrs }, label);
  b.addEventListener('click', onClick);
  return b;
}

export const LOAD_HINT = '%load_ext apollia_nb';

function statusMessage(state: PanelState, handlers: Handlers, doc: Document): HTMLElement | null {
  const c = state.connection;
  switch (c.kind) {
    case 'no-notebook':
      return h(doc, 'p', { class: 'apollia-status', role: 'status' },
        'Open a notebook: the panel shows the apollia home of its kernel.');
    case 'no-kernel':
      return h(doc, 'p', { class: 'apollia-status', role: 'status' },
        'This notebook has no running kernel. Start one to see its agents, inbox and journal.');
    case 'connecting':
      return h(doc, 'p', { class: 'apollia-status', role: 'status' }, 'Connecting to the kernel…');
    case 'not-loaded':
      return h(doc, 'div', { class: 'apollia-status apollia-not-loaded', role: 'status' },
        h(doc, 'p', {}, 'apollia-nb is not loaded in this kernel. Run this in a cell:'),
        h(doc, 'pre', { class: 'apollia-code' }, LOAD_HINT),
        h(doc, 'p', {}, 'The panel connects when the cell has run.'),
        button(doc, 'Connect now', handlers.refresh, { 'aria-label': 'Connect to the kernel again' }));
    case 'error':
      return h(doc, 'div', { class: 'apollia-status apollia-error', role: 'alert' },
        h(doc, 'p', {}, c.message),
        button(doc, 'Retry', handlers.refresh, { 'aria-label': 'Connect to the kernel again' }));
    case 'connected':
      return null;
  }
}

function argumentRow(card: Card, name: string, value: unknown, state: PanelState, handlers: Handlers, doc: Document): HTMLElement[] {
  const key = `${card.id}/${name}`;
  const text = valueText(value);
  const f = fold(text);
  const open = Boolean(state.unfolded[key]);
  const shown = f.hiddenChars === 0 || open ? f.full : f.head;
  const dd = h(doc, 'dd', { class: 'apollia-arg-value' }, h(doc, 'pre', { class: 'apollia-code' }, shown));
  if (f.hiddenChars > 0) {
    const hidden = `${f.hiddenChars} more character${f.hiddenChars === 1 ? '' : 's'}` +
      (f.hiddenLines > 0 ? `, ${f.hiddenLines} more line${f.hiddenLines === 1 ? '' : 's'}` : '');
    if (!open) {
      dd.append(h(doc, 'span', { class: 'apollia-folded-note' }, `… ${hidden} folded`));
    }
    dd.append(button(doc, open ? 'show less' : 'show all', () => handlers.toggleUnfold(key), {
      class: 'apollia-button apollia-link',
      'aria-expanded': String(open),
      'aria-label': `${open ? 'Fold' : 'Show all of'} the argument ${name} (${text.length} characters)`
    }));
  }
  return [h(doc, 'dt', { class: 'apollia-arg-name' }, name), dd];
}

/** What a card belongs to: the goal of its task or chat, and the ids that tell it apart. */
function identity(doc: Document, owner: string, goal: string | null | undefined, ids: [string, string | null | undefined][]): HTMLElement[] {
  const shown = ids.filter(([, v]) => v);
  return [
    h(doc, 'p', { class: 'apollia-goal' }, h(doc, 'span', { class: 'apollia-goal-kind' }, `${owner}: `),
      goal ? goal : h(doc, 'i', {}, 'goal not known')),
    h(doc, 'p', { class: 'apollia-ids' }, ...shown.flatMap(([k, v], i) =>
      [i ? ' · ' : '', `${k} `, h(doc, 'code', { class: `apollia-id apollia-id-${k}` }, v!)]))
  ];
}

function quoted(goal: string | null | undefined): string {
  if (!goal) {
    return '';
  }
  return ` for "${goal.length > 80 ? `${goal.slice(0, 79)}…` : goal}"`;
}

export function renderCard(card: Card, state: PanelState, handlers: Handlers, now: number, doc: Document): HTMLElement {
  const answered = answeredOf(card);
  const sending = state.answering[card.id];
  const failed = state.cardErrors[card.id];
  const title = `${card.agent} wants ${card.tool}${quoted(card.goal)}`;
  const el = h(doc, 'article', {
    class: `apollia-card${answered ? ' apollia-card-answered' : ''}`,
    'aria-label': `Decision: ${title}${answered ? `, answered ${answered.answer}` : ', waiting'}`,
    'data-card-id': card.id,
    'data-task-id': card.task_id ?? undefined
  });
  el.append(h(doc, 'header', { class: 'apollia-card-head' },
    h(doc, 'span', { class: 'apollia-agent' }, card.agent),
    ' · ',
    h(doc, 'code', { class: 'apollia-tool' }, card.tool),
    ' · ',
    h(doc, 'span', { class: 'apollia-family' }, card.family ?? 'unclassified'),
    h(doc, 'span', { class: 'apollia-age', title: askedAt(card) ?? '' }, askedAt(card) ? `asked ${age(askedAt(card), now)} ago` : '')));
  const owner = card.owner ?? (card.session_id ? 'chat' : 'task');
  el.append(...identity(doc, owner, card.goal, owner === 'chat'
    ? [['chat', card.session_id], ['run', card.run_id], ['card', card.id]]
    : [['task', card.task_id], ['run', card.run_id], ['card', card.id]]));
  if (card.line !== undefined && card.line !== null && card.line !== '' ) {
    el.append(h(doc, 'p', { class: 'apollia-asking-line' }, `asked by governance line ${card.line}`,
      card.reason ? h(doc, 'span', { class: 'apollia-reason' }, `: ${card.reason}`) : null));
  } else if (card.reason) {
    el.append(h(doc, 'p', { class: 'apollia-reason' }, card.reason));
  }
  if (card.hints && Object.keys(card.hints).length > 0) {
    el.append(h(doc, 'p', { class: 'apollia-hints', 'aria-label': 'MCP hints' }, 'hints: ',
      ...Object.entries(card.hints).map(([k, v]) => h(doc, 'span', { class: 'apollia-hint' }, `${k}=${valueText(v)}`))));
  }
  const args = h(doc, 'dl', { class: 'apollia-args', 'aria-label': 'arguments' });
  const entries = Object.entries(card.arguments ?? {});
  if (entries.length === 0) {
    args.append(h(doc, 'dt', { class: 'apollia-arg-name' }, '(no arguments)'));
  }
  for (const [name, value] of entries) {
    args.append(...argumentRow(card, name, value, state, handlers, doc));
  }
  el.append(args);
  if (answered) {
    el.append(h(doc, 'p', { class: 'apollia-answered', role: 'status' },
      `answered `, h(doc, 'strong', {}, answered.answer),
      answered.by ? ` by ${answered.by}` : '',
      answered.at ? ` at ${clock(answered.at)}` : ''));
  } else {
    if (card.you?.why) {
      el.append(h(doc, 'p', { class: 'apollia-may-not', role: 'note' }, card.you.why));
    }
    const buttons = h(doc, 'div', { class: 'apollia-answers', role: 'group', 'aria-label': `Answers for ${title}` });
    for (const answer of card.you ? card.you.answers : card.answers) {
      const b = button(doc, answer, () => handlers.answer(card.id, answer), {
        class: `apollia-button apollia-answer apollia-answer-${answer}`,
        'data-answer': answer,
        'aria-label': `Answer ${answer}: ${title}`
      });
      if (sending) {
        b.setAttribute('disabled', '');
      }
      buttons.append(b);
      if (answer === 'always' && String(card.line ?? '') !== '4') {  // a command's rule has no lifetime
        buttons.append(lifetimeSelect(card, title, handlers, doc, Boolean(sending)));
      }
    }
    el.append(buttons);
    if (sending) {
      el.append(h(doc, 'p', { class: 'apollia-sending', role: 'status' }, `sending ${sending}…`));
    }
  }
  if (failed) {
    el.append(h(doc, 'p', { class: 'apollia-card-error', role: 'alert' }, `${failed.code}: ${failed.message}`));
  }
  return el;
}

/** How long an `always` lasts, as the select beside it offers: the answer's `for` ('' until revoked). */
export const LIFETIMES: ReadonlyArray<readonly [string, string]> = [
  ['', 'until revoked'], ['1h', 'for 1 h'], ['8h', 'for 8 h'], ['24h', 'for 24 h']
];

function lifetimeSelect(card: Card, title: string, handlers: Handlers, doc: Document, disabled: boolean): HTMLElement {
  const chosen = handlers.lifetimeOf?.(card.id) ?? '';
  const select = h(doc, 'select', {
    class: 'apollia-lifetime', 'data-lifetime-for': card.id, 'aria-label': `How long always lasts: ${title}`,
    disabled: disabled ? '' : undefined
  }, ...LIFETIMES.map(([value, words]) => h(doc, 'option', { value, selected: value === chosen ? '' : undefined }, words)));
  select.addEventListener('change', () => handlers.chooseLifetime?.(card.id, (select as HTMLSelectElement).value));
  return select;
}

/** A plan waiting for approval: its steps, editable one per line; approve (as edited) or reject with a reason. */
export function renderPlan(plan: PlanItem, state: PanelState, handlers: Handlers, now: number, doc: Document): HTMLElement {
  const sending = state.planSending[plan.task_id];
  const failed = state.planErrors[plan.task_id];
  const draft = state.planDrafts[plan.task_id];
  const title = `${plan.agent}'s plan${quoted(plan.goal)}`;
  const el = h(doc, 'article', {
    class: 'apollia-card apollia-plan', 'aria-label': `Plan approval: ${title}, waiting`,
    'data-plan-id': plan.task_id, 'data-task-id': plan.task_id
  });
  el.append(h(doc, 'header', { class: 'apollia-card-head' },
    h(doc, 'span', { class: 'apollia-agent' }, plan.agent), ' · ',
    h(doc, 'span', { class: 'apollia-family' }, 'plan to approve'),
    h(doc, 'span', { class: 'apollia-age', title: plan.asked_at ?? '' }, plan.asked_at ? `asked ${age(plan.asked_at, now)} ago` : '')));
  el.append(...identity(doc, 'task', plan.goal, [['task', plan.task_id], ['run', plan.run_id]]));
  const stepsId = `apollia-plan-steps-${plan.task_id}`;
  const reasonId = `apollia-plan-reason-${plan.task_id}`;
  const steps = h(doc, 'textarea', {
    id: stepsId, class: 'apollia-plan-steps', rows: String(Math.max(3, plan.steps.length + 1)),
    'aria-label': `Steps of ${title}, one per line`
  }) as HTMLTextAreaElement;
  steps.value = draft ?? plan.steps.join('\n');
  steps.addEventListener('input', () => handlers.editPlan(plan.task_id, steps.value));
  const reason = h(doc, 'input', {
    id: reasonId, type: 'text', class: 'apollia-plan-reason', placeholder: 'reason for rejecting',
    'aria-label': `Reason for rejecting ${title}`
  }) as HTMLInputElement;
  reason.value = state.planReasons[plan.task_id] ?? '';
  reason.addEventListener('input', () => handlers.editReason(plan.task_id, reason.value));
  const approve = button(doc, 'approve', () => handlers.approvePlan(plan.task_id), {
    class: 'apollia-button apollia-answer apollia-plan-approve', 'data-answer': 'approve',
    'aria-label': `Approve ${title}${draft !== undefined ? ' as edited' : ''}`
  });
  const reject = button(doc, 'reject', () => handlers.rejectPlan(plan.task_id), {
    class: 'apollia-button apollia-answer apollia-plan-reject', 'data-answer': 'reject', 'aria-label': `Reject ${title}`
  });
  if (sending) {
    for (const part of [steps, reason, approve, reject]) {
      part.setAttribute('disabled', '');
    }
  }
  el.append(
    h(doc, 'label', { class: 'apollia-plan-label', for: stepsId }, 'Proposed steps, one per line: edit them before approving'),
    steps,
    h(doc, 'div', { class: 'apollia-answers', role: 'group', 'aria-label': `Answers for ${title}` }, approve, reason, reject));
  if (sending) {
    el.append(h(doc, 'p', { class: 'apollia-sending', role: 'status' }, `sending ${sending}…`));
  }
  if (failed) {
    el.append(h(doc, 'p', { class: 'apollia-card-error', role: 'alert' }, `${failed.code}: ${failed.message}`));
  }
  return el;
}

function section(doc: Document, id: string, title: string, ...children: Child[]): HTMLElement {
  return h(doc, 'section', { class: `apollia-section apollia-${id}`, 'aria-labelledby': `apollia-h-${id}` },
    h(doc, 'h2', { id: `apollia-h-${id}`, class: 'apollia-section-title' }, title), ...children);
}

function renderInbox(state: PanelState, handlers: Handlers, now: number, doc: Document): HTMLElement {
  const inbox = state.snapshot?.inbox ?? [];
  const waiting = waitingCards(state);
  const plans = plansOf(state.snapshot);
  const answered = cardsOf(state.snapshot).filter(c => answeredOf(c));
  const count = waiting.length + plans.length;
  const title = count ? `Inbox (${count} waiting)` : 'Inbox';
  return section(doc, 'inbox', title,
    inbox.length === 0 ? h(doc, 'p', { class: 'apollia-empty' }, 'Nothing waits for a decision.') : null,
    ...plans.map(p => renderPlan(p, state, handlers, now, doc)),
    ...waiting.map(c => renderCard(c, state, handlers, now, doc)),
    ...answered.map(c => renderCard(c, state, handlers, now, doc)));
}

function agentRow(agent: Agent, doc: Document): HTMLElement {
  return h(doc, 'li', { class: 'apollia-agent-row' },
    h(doc, 'span', { class: 'apollia-agent' }, agent.name), ' ',
    h(doc, 'span', { class: `apollia-state apollia-state-${agent.state}` }, agent.state),
    typeof agent.inflight === 'number' && agent.inflight > 0 ? ` · ${agent.inflight} in flight` : '');
}

function runRow(run: Run, state: PanelState, handlers: Handlers, doc: Document): HTMLElement {
  const id = runId(run);
  const budget = budgetOf(run);
  const label = run.goal ?? run.title ?? '';
  const open = state.openRun?.runId === id;
  const li = h(doc, 'li', { class: `apollia-run apollia-run-${run.status}`, 'data-run-id': id });
  li.append(button(doc, `${run.kind} ${run.agent}: ${label}`, () => handlers.openRun(id), {
    class: 'apollia-button apollia-link apollia-run-open',
    'aria-expanded': String(open),
    'aria-label': `Journal entries of the ${run.kind} ${id} (${run.agent}, ${run.status})`
  }));
  li.append(h(doc, 'span', { class: `apollia-state apollia-state-${run.status}` }, runStateWords(run)));
  if (budget) {
    const pct = Math.min(100, Math.round((100 * budget.used) / budget.max));
    li.append(h(doc, 'div', {
      class: 'apollia-budget', role: 'progressbar', 'aria-label': 'step budget',
      'aria-valuemin': '0', 'aria-valuemax': String(budget.max), 'aria-valuenow': String(budget.used),
      title: `${budget.used} of ${budget.max} steps`
    }, h(doc, 'div', { class: 'apollia-budget-track' }, h(doc, 'div', { class: 'apollia-budget-fill', style: `width: ${pct}%` })),
      h(doc, 'span', { class: 'apollia-budget-text' }, `${budget.used}/${budget.max} steps`)));
  }
  if (run.step) {
    li.append(h(doc, 'p', { class: 'apollia-step' }, run.step));
  }
  const reasoning = reasoningOf(run);
  if (reasoning) {
    li.append(reasoning(doc));
  }
  if (open && state.openRun) {
    li.append(renderRunEntries(state, doc));
  }
  return li;
}

/**
 * The model's reasoning in a run's row, folded (a native disclosure: keyboard operable, closed until
 * asked). Its text is only ever text content; opaque reasoning arrives as "[redacted reasoning]".
 */
function reasoningOf(run: Run): ((doc: Document) => HTMLElement) | null {
  const r = run.reasoning;
  if (!r || typeof r.text !== 'string' || !r.text) {
    return null;
  }
  const chars = typeof r.chars === 'number' ? r.chars : r.text.length;
  const more = chars > r.text.length ? ` … (+${chars - r.text.length} characters in the notebook and the journal)` : '';
  return doc => h(doc, 'details', { class: 'apollia-reasoning' },
    h(doc, 'summary', {}, `Reasoning of step ${r.step} (${chars} characters)`),
    h(doc, 'pre', { class: 'apollia-reasoning-text' }, r.text + more));
}

function entrySummary(e: JournalEntry): string {
  const payload = (e as { payload?: unknown }).payload;
  if (payload && typeof payload === 'object') {
    const parts = Object.entries(payload as Record<string, unknown>)
      .filter(([, v]) => v !== null && typeof v !== 'object')
      .slice(0, 4)
      .map(([k, v]) => `${k}=${String(v)}`);
    return parts.join(' ');
  }
  return e.summary ?? '';
}

function entryRow(e: JournalEntry, doc: Document): HTMLElement {
  const kind = e.kind ?? e.type ?? '';
  const summary = entrySummary(e);
  const f = fold(summary);
  return h(doc, 'li', { class: 'apollia-entry', 'data-seq': String(e.seq) },
    h(doc, 'span', { class: 'apollia-seq' }, `#${e.seq}`), ' ',
    h(doc, 'span', { class: 'apollia-kind' }, kind),
    summary ? h(doc, 'span', { class: 'apollia-entry-summary', title: f.full }, ` ${f.head}${f.hiddenChars ? ` … (+${f.hiddenChars})` : ''}`) : null);
}

function renderRunEntries(state: PanelState, doc: Document): HTMLElement {
  const r = state.openRun!;
  if (r.entries === null) {
    return h(doc, 'p', { class: 'apollia-status', role: 'status' }, 'Loading its journal entries…');
  }
  if (r.error) {
    return h(doc, 'p', { class: 'apollia-error', role: 'alert' }, r.error);
  }
  return h(doc, 'ol', { class: 'apollia-entries apollia-run-entries', 'aria-label': `journal entries of ${r.runId}` },
    ...(r.entries.length ? r.entries.map(e => entryRow(e, doc)) : [h(doc, 'li', {}, 'no entries')]));
}

function renderAgents(state: PanelState, handlers: Handlers, doc: Document): HTMLElement {
  const snap = state.snapshot!;
  const { active, finished } = splitRuns(snap.runs);
  const s = section(doc, 'agents', 'Agents and runs');
  s.append(snap.agents.length
    ? h(doc, 'ul', { class: 'apollia-agents', 'aria-label': 'agents' }, ...snap.agents.map(a => agentRow(a, doc)))
    : h(doc, 'p', { class: 'apollia-empty' }, 'No agent is registered.'));
  s.append(active.length
    ? h(doc, 'ul', { class: 'apollia-runs', 'aria-label': 'running and waiting runs' }, ...active.map(r => runRow(r, state, handlers, doc)))
    : h(doc, 'p', { class: 'apollia-empty' }, 'Nothing is running.'));
  if (finished.length) {
    s.append(button(doc, `${state.showFinished ? 'Hide' : 'Show'} ${finished.length} finished`, handlers.toggleFinished, {
      class: 'apollia-button apollia-link apollia-finished-toggle', 'aria-expanded': String(state.showFinished)
    }));
    if (state.showFinished) {
      s.append(h(doc, 'ul', { class: 'apollia-runs apollia-finished', 'aria-label': 'finished runs' },
        ...finished.map(r => runRow(r, state, handlers, doc))));
    }
  }
  return s;
}

function verifyBadge(state: PanelState, doc: Document): HTMLElement {
  const { state: st, text } = verifyWords(state.snapshot!.journal, state.verifying);
  return h(doc, 'span', { class: `apollia-verify apollia-verify-${st}`, role: 'status', 'aria-label': `journal verification: ${text}` }, text);
}

function renderJournal(state: PanelState, handlers: Handlers, doc: Document): HTMLElement {
  const j = state.snapshot!.journal;
  const checkpoint = j.last_checkpoint === null || j.last_checkpoint === undefined
    ? 'none'
    : typeof j.last_checkpoint === 'object'
      ? `#${(j.last_checkpoint as { seq?: number; size?: number }).seq ?? (j.last_checkpoint as { size?: number }).size ?? '?'}`
      : `#${String(j.last_checkpoint)}`;
  return section(doc, 'journal', 'Journal',
    h(doc, 'dl', { class: 'apollia-head' },
      h(doc, 'dt', {}, 'size'), h(doc, 'dd', { class: 'apollia-journal-size' }, String(j.size)),
      h(doc, 'dt', {}, 'root'), h(doc, 'dd', {}, h(doc, 'code', { title: j.root ?? '' }, shortHash(j.root))),
      h(doc, 'dt', {}, 'last checkpoint'), h(doc, 'dd', {}, checkpoint)),
    h(doc, 'p', { class: 'apollia-verify-row' }, verifyBadge(state, doc), ' ',
      button(doc, 'Verify now', handlers.verify, { 'aria-label': 'Verify the journal now', ...(state.verifying ? { disabled: '' } : {}) })),
    state.verifyError ? h(doc, 'p', { class: 'apollia-error', role: 'alert' }, state.verifyError) : null,
    h(doc, 'h3', { class: 'apollia-subtitle' }, 'Latest entries'),
    j.latest.length
      ? h(doc, 'ol', { class: 'apollia-entries apollia-latest', 'aria-label': 'latest journal entries' }, ...j.latest.map(e => entryRow(e, doc)))
      : h(doc, 'p', { class: 'apollia-empty' }, 'The journal is empty.'));
}

/** The whole panel body for `state`. */
export function renderPanel(state: PanelState, handlers: Handlers, now: number, doc: Document = document): HTMLElement {
  const root = h(doc, 'div', { class: 'apollia-panel-body' });
  const status = statusMessage(state, handlers, doc);
  if (status) {
    root.append(status);
  }
  const snap = state.snapshot;
  if (state.connection.kind === 'connected' && !snap) {
    root.append(state.error
      ? h(doc, 'div', { class: 'apollia-status apollia-error', role: 'alert' },
        h(doc, 'p', {}, state.error),
        button(doc, 'Retry', handlers.refresh, { 'aria-label': 'Connect to the kernel again' }))
      : h(doc, 'p', { class: 'apollia-status', role: 'status' }, 'Loading…'));
    return root;
  }
  if (!snap || state.connection.kind !== 'connected') {
    return root;
  }
  if (snap.mode === 'served') {
    root.append(h(doc, 'p', { class: 'apollia-banner', role: 'note' },
      `shared home: showing every run of ${snap.server ?? 'the server'}`));
  }
  root.append(h(doc, 'p', { class: 'apollia-home', title: snap.home }, `home ${snap.home}`));
  if (snap.me) {
    root.append(h(doc, 'p', { class: 'apollia-me', 'aria-label': 'who you are' },
      'you: ', h(doc, 'strong', {}, snap.me.name), ` (${snap.me.role})`));
  }
  if (state.error) {
    root.append(h(doc, 'p', { class: 'apollia-error', role: 'alert' }, state.error));
  }
  for (const p of snap.problems ?? []) {
    root.append(h(doc, 'p', { class: 'apollia-error apollia-problem', role: 'alert' }, `${p.part}: ${p.code}: ${p.message}`));
  }
  root.append(renderInbox(state, handlers, now, doc));
  root.append(renderAgents(state, handlers, doc));
  root.append(renderJournal(state, handlers, doc));
  return root;
}
