import { describe, expect, it, vi } from 'vitest';
import { Handlers, LIFETIMES, renderPanel } from '../src/render';
import { PanelState, initialState, reduce } from '../src/state';
import { card, snapshot } from './fixtures';
import { Snapshot } from '../src/protocol';

const NOW = Date.parse('2026-12-01T12:03:00Z');

function shown(snap: Snapshot): PanelState {
  const s = reduce(initialState, { type: 'notebook', path: 'a.ipynb' });
  return reduce(s, { type: 'snapshot', snapshot: snap, version: 1 });
}

function handlers(chosen: Record<string, string> = {}): Handlers & { [k: string]: ReturnType<typeof vi.fn> } {
  return {
    answer: vi.fn(), toggleUnfold: vi.fn(), toggleFinished: vi.fn(), openRun: vi.fn(), verify: vi.fn(), refresh: vi.fn(),
    approvePlan: vi.fn(), rejectPlan: vi.fn(), editPlan: vi.fn(), editReason: vi.fn(),
    chooseLifetime: vi.fn((id: string, v: string) => { chosen[id] = v; }),
    lifetimeOf: vi.fn((id: string) => chosen[id] ?? '')
  } as never;
}

describe('how long always lasts', () => {
  it('a select beside always offers until revoked, 1 h, 8 h and 24 h; a choice is kept across renders', () => {
    const chosen: Record<string, string> = {};
    const hs = handlers(chosen);
    let el = renderPanel(shown(snapshot({ inbox: [card({ answers: ['once', 'always', 'refuse'] })] })), hs, NOW, document);
    document.body.replaceChildren(el);
    const select = el.querySelector<HTMLSelectElement>('select.apollia-lifetime[data-lifetime-for="pd-1"]')!;
    expect([...select.options].map(o => [o.value, o.textContent])).toEqual(LIFETIMES.map(([v, w]) => [v, w]));
    expect(select.value).toBe('');  // until revoked unless chosen
    expect(select.previousElementSibling!.getAttribute('data-answer')).toBe('always');
    select.value = '8h';
    select.dispatchEvent(new Event('change'));
    expect(hs.chooseLifetime).toHaveBeenCalledWith('pd-1', '8h');
    el = renderPanel(shown(snapshot({ inbox: [card({ answers: ['once', 'always', 'refuse'] })] })), hs, NOW, document);
    expect(el.querySelector<HTMLSelectElement>('select.apollia-lifetime')!.value).toBe('8h');
  });

  it('no select without always, nor beside the always of a command (a rule has no lifetime)', () => {
    const none = renderPanel(shown(snapshot({ inbox: [card({ answers: ['once', 'refuse'] })] })), handlers(), NOW, document);
    expect(none.querySelector('select.apollia-lifetime')).toBeNull();
    const command = renderPanel(shown(snapshot({ inbox: [card({ answers: ['once', 'always', 'refuse'], line: 4 })] })),
      handlers(), NOW, document);
    expect(command.querySelector('select.apollia-lifetime')).toBeNull();
  });
});
