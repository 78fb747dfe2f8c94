import { describe, expect, it, vi } from 'vitest';
import { Handlers, renderPanel } from '../src/render';
import { PanelState, initialState, reduce } from '../src/state';
import { card, snapshot } from './fixtures';
import { Snapshot } from '../src/protocol';

const NOW = Date.parse('2026-12-01T12:03:00Z');

function handlers(): Handlers & { [k: string]: ReturnType<typeof vi.fn> } {
  return {
    answer: vi.fn(), toggleUnfold: vi.fn(), toggleFinished: vi.fn(), openRun: vi.fn(), verify: vi.fn(), refresh: vi.fn(),
    approvePlan: vi.fn(), rejectPlan: vi.fn(), editPlan: vi.fn(), editReason: vi.fn(), chooseLifetime: vi.fn()
  } as never;
}

function render(snap: Snapshot, hs = handlers()): HTMLElement {
  let s: PanelState = reduce(initialState, { type: 'notebook', path: 'a.ipynb' });
  s = reduce(s, { type: 'snapshot', snapshot: snap, version: 1 });
  const el = renderPanel(s, hs, NOW, document);
  document.body.replaceChildren(el);
  return el;
}

const MAY = { roles: ['approver'], four_eyes: true, started_by: 'ann', excluded: ['ann'], approvers: 1,
  approved_by: [], approvals_needed: 1 };

describe('who you are and the answers you may give', () => {
  it('names the person at the panel and their role', () => {
    const el = render(snapshot({ me: { name: 'ann', role: 'owner of this home', auth: 'local' } }));
    expect(el.querySelector('.apollia-me')?.textContent).toBe('you: ann (owner of this home)');
  });

  it('shows why instead of the approving buttons of a card the person may not approve, and keeps refuse', () => {
    const why = 'Four eyes: you (ann) started this run, so another person with the approver role must approve it. You may refuse it.';
    const hs = handlers();
    const el = render(snapshot({ inbox: [
      card({ answers: ['once', 'always', 'refuse'], may_answer: MAY, you: { answers: ['refuse'], why } }),
      card({ id: 'pd-2', answers: ['once', 'always', 'refuse'], may_answer: { ...MAY, excluded: ['bob'] },
        you: { answers: ['once', 'always', 'refuse'], why: null } })] }), hs);
    const article = el.querySelector('article[data-card-id="pd-1"]')!;
    expect(article.querySelector('.apollia-may-not')?.textContent).toBe(why);
    expect(article.querySelector('.apollia-may-not')?.getAttribute('role')).toBe('note');
    const answers = [...article.querySelectorAll('button[data-answer]')].map(b => b.getAttribute('data-answer'));
    expect(answers).toEqual(['refuse']);
    (article.querySelector('button[data-answer="refuse"]') as HTMLButtonElement).click();
    expect(hs.answer).toHaveBeenCalledWith('pd-1', 'refuse');
    const other = el.querySelector('article[data-card-id="pd-2"]')!;  // a card this person may approve
    expect(other.querySelector('.apollia-may-not')).toBeNull();
    expect([...other.querySelectorAll('button[data-answer]')].map(b => b.getAttribute('data-answer')))
      .toEqual(['once', 'always', 'refuse']);
  });
});
