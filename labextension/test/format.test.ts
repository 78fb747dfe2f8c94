import { describe, expect, it } from 'vitest';
import { FOLD_CHARS, FOLD_LINES, age, fold, valueText } from '../src/format';

describe('fold', () => {
  it('keeps a short value whole', () => {
    expect(fold('hello')).toEqual({ head: 'hello', hiddenChars: 0, hiddenLines: 0, full: 'hello' });
  });

  it('folds a long value and says exactly how much it hides: head + hidden is the whole value', () => {
    const long = 'x'.repeat(FOLD_CHARS + 123);
    const f = fold(long);
    expect(f.head.length).toBe(FOLD_CHARS);
    expect(f.hiddenChars).toBe(123);
    expect(f.head + long.slice(f.head.length)).toBe(long);
    expect(f.full).toBe(long);
  });

  it('folds many lines after FOLD_LINES lines', () => {
    const text = Array.from({ length: FOLD_LINES + 4 }, (_, i) => `line ${i}`).join('\n');
    const f = fold(text);
    expect(f.head.split('\n')).toHaveLength(FOLD_LINES);
    expect(f.hiddenLines).toBe(4);
    expect(f.hiddenChars).toBe(text.length - f.head.length);
  });
});

describe('valueText and age', () => {
  it('strings as they are, anything else as JSON', () => {
    expect(valueText('a "b"')).toBe('a "b"');
    expect(valueText({ a: [1, 2] })).toBe('{\n  "a": [\n    1,\n    2\n  ]\n}');
    expect(valueText(null)).toBe('null');
  });

  it('ages in s, min, h, d; nothing for a missing or bad time', () => {
    const now = Date.parse('2026-12-01T12:00:00Z');
    expect(age('2026-12-01T11:59:48Z', now)).toBe('12 s');
    expect(age('2026-12-01T11:57:00Z', now)).toBe('3 min');
    expect(age('2026-12-01T09:00:00Z', now)).toBe('3 h');
    expect(age('2026-11-28T12:00:00Z', now)).toBe('3 d');
    expect(age(null, now)).toBe('');
    expect(age('not a time', now)).toBe('');
  });
});
