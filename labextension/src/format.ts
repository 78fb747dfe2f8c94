/** Pure formatting helpers: argument values, folding, ages, notification texts. */

import { InboxItem, isPlan } from './protocol';

/** A value longer than this (characters) or than FOLD_LINES lines is folded behind "show all". */
export const FOLD_CHARS = 240;
export const FOLD_LINES = 6;

export function valueText(value: unknown): string {
  if (typeof value === 'string') {
    return value;
  }
  if (value === undefined) {
    return 'undefined';
  }
  try {
    return JSON.stringify(value, null, 2) ?? String(value);
  } catch {
    return String(value);
  }
}

export interface Folded {
  /** What is shown while folded. */
  head: string;
  /** How much the fold hides (0: nothing is folded). */
  hiddenChars: number;
  hiddenLines: number;
  full: string;
}

/** Splits a long text into a head and what is hidden; never drops anything: `full` keeps it all. */
export function fold(text: string): Folded {
  const lines = text.split('\n');
  let head = text;
  if (lines.length > FOLD_LINES) {
    head = lines.slice(0, FOLD_LINES).join('\n');
  }
  if (head.length > FOLD_CHARS) {
    head = head.slice(0, FOLD_CHARS);
  }
  const hidden = text.slice(head.length);
  return {
    head,
    hiddenChars: hidden.length,
    hiddenLines: hidden.split('\n').length - 1,
    full: text
  };
}

/** "12 s", "3 min", "2 h", "4 d" since `iso`, at `now` (ms). */
export function age(iso: string | null | undefined, now: number): string {
  if (!iso) {
    return '';
  }
  const then = Date.parse(iso);
  if (Number.isNaN(then)) {
    return '';
  }
  const s = Math.max(0, Math.round((now - then) / 1000));
  if (s < 60) {
    return `${s} s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)} min`;
  }
  if (s < 86400) {
    return `${Math.floor(s / 3600)} h`;
  }
  return `${Math.floor(s / 86400)} d`;
}

/** A time of day for "answered by ann at 14:02:11", in the browser's zone. */
export function clock(iso: string | null | undefined): string {
  if (!iso) {
    return '';
  }
  const t = new Date(iso);
  if (Number.isNaN(t.getTime())) {
    return iso;
  }
  return t.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false });
}

export function shortHash(root: string | null | undefined): string {
  return root ? root.slice(0, 12) : '—';
}

function goalWords(goal: string | null | undefined): string {
  if (!goal) {
    return '';
  }
  return ` for "${goal.length > 60 ? `${goal.slice(0, 59)}…` : goal}"`;
}

/** The notification text for questions (cards, plans) that start waiting. */
export function notificationText(items: InboxItem[]): string {
  if (items.length === 1) {
    const c = items[0];
    if (isPlan(c)) {
      return `apollia: ${c.agent} asks you to approve its plan${goalWords(c.goal)}: answer it in the apollia panel`;
    }
    return `apollia: ${c.agent} asks to use ${c.tool} (${c.family ?? 'unclassified'})${goalWords(c.goal)}: answer it in the apollia panel`;
  }
  return `apollia: ${items.length} new decisions wait in the apollia panel`;
}
