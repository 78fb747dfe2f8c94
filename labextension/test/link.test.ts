import { describe, expect, it } from 'vitest';
import { KernelComm, KernelLike, KernelLink } from '../src/link';
import { PanelClient, PanelError } from '../src/protocol';
import { Action } from '../src/state';
import { snapshot } from './fixtures';

/** A kernel whose comm answers like the kernel's `apollia.panel` target, or has no such target. */
class FakeKernel implements KernelLike {
  info = Promise.resolve({});
  sent: Record<string, unknown>[] = [];
  comm!: KernelComm & { opened: boolean };
  constructor(public supportsSubshells: boolean, private readonly loaded: boolean, public commsOverSubshells = 'perCommTarget',
              public reply: (req: Record<string, unknown>) => Record<string, unknown> | null = req => ({ id: req.id, ok: true, data: snapshot() })) {}
  createComm(): KernelComm {
    const kernel = this;
    let setting = this.commsOverSubshells;
    let started: () => void = () => {};
    const subshellStarted = new Promise<void>(resolve => { started = resolve; });
    const comm = {
      opened: false,
      subshellId: null as string | null,
      subshellStarted,
      get commsOverSubshells() { return setting; },
      set commsOverSubshells(v: string) { setting = v; if (v !== 'disabled') { comm.subshellId = 'sub-1'; started(); } },
      onMsg: (_: { content: { data: unknown } }) => {},
      onClose: (_: unknown) => {},
      open() {
        comm.opened = true;
        if (!kernel.loaded) { queueMicrotask(() => comm.onClose({})); }
      },
      send(data: Record<string, unknown>) {
        expect(comm.opened).toBe(true);
        kernel.sent.push({ ...data, subshell: comm.subshellId });
        const r = kernel.reply(data);
        if (r) { queueMicrotask(() => comm.onMsg({ content: { data: r } })); }
      },
      close() {}
    };
    if (this.supportsSubshells && setting !== 'disabled') { comm.subshellId = 'sub-1'; started(); }
    this.comm = comm;
    return comm;
  }
}

function collect(): { actions: Action[]; dispatch: (a: Action) => void } {
  const actions: Action[] = [];
  return { actions, dispatch: a => actions.push(a) };
}

describe('KernelLink', () => {
  it('opens the comm on a subshell and sends nothing before the subshell exists', async () => {
    const k = new FakeKernel(true, true);
    const { actions, dispatch } = collect();
    const link = new KernelLink(k, dispatch);
    await link.connect();
    expect(link.info.subshell).toBe(true);
    expect(k.sent).toHaveLength(1);
    expect(k.sent[0]).toMatchObject({ op: 'snapshot', subshell: 'sub-1' });
    expect(actions.map(a => a.type)).toEqual(['connecting', 'connected', 'snapshot']);
  });

  it('turns subshells on for its own comm when the connection has them off', async () => {
    const k = new FakeKernel(true, true, 'disabled');
    const link = new KernelLink(k, collect().dispatch);
    await link.connect();
    expect(k.comm.commsOverSubshells).toBe('perCommTarget');
    expect(k.sent[0].subshell).toBe('sub-1');
    expect(link.info.subshell).toBe(true);
  });

  it('a kernel without subshells still works, over the main shell, and says so', async () => {
    const k = new FakeKernel(false, true);
    const link = new KernelLink(k, collect().dispatch);
    await link.connect();
    expect(link.info.subshell).toBe(false);
    expect(k.sent[0].subshell).toBeNull();
  });

  it('a kernel without the extension loaded closes the comm: the panel says not-loaded', async () => {
    const k = new FakeKernel(true, false, 'perCommTarget', () => null);
    const { actions, dispatch } = collect();
    const link = new KernelLink(k, dispatch);
    await link.connect();
    expect(actions.map(a => a.type)).toEqual(['connecting', 'not-loaded']);
    expect(link.connected).toBe(false);
  });

  it('a changed push asks for a new snapshot; pushes during a request coalesce into one more request', async () => {
    const k = new FakeKernel(true, true);
    const { actions, dispatch } = collect();
    const link = new KernelLink(k, dispatch);
    await link.connect();
    k.comm.onMsg({ content: { data: { event: 'changed', version: 3 } } });
    k.comm.onMsg({ content: { data: { event: 'changed', version: 4 } } });
    k.comm.onMsg({ content: { data: { event: 'changed', version: 5 } } });
    await new Promise(r => setTimeout(r, 10));
    expect(k.sent.filter(s => s.op === 'snapshot')).toHaveLength(3); // the first, then one, then one for the rest
    const snaps = actions.filter(a => a.type === 'snapshot') as Extract<Action, { type: 'snapshot' }>[];
    // Numbered by the link, in the order asked, whatever the kernel's counter says.
    expect(snaps.map(a => a.version)).toEqual([1, 2, 3]);
    expect((actions.filter(a => a.type === 'changed') as Extract<Action, { type: 'changed' }>[]).map(a => a.version)).toEqual([3, 4, 5]);
  });

  it('answers send card_id and answer; a refusal is dispatched with its code, then the snapshot is fetched again', async () => {
    const k = new FakeKernel(true, true, 'perCommTarget', req => req.op === 'answer'
      ? { id: req.id, ok: false, error: { code: 'CONFLICT', message: 'answered by bob', answered: { answer: 'never', by: 'bob', at: null } } }
      : { id: req.id, ok: true, data: snapshot() });
    const { actions, dispatch } = collect();
    const link = new KernelLink(k, dispatch);
    await link.connect();
    await link.answer('pd-1', 'once');
    expect(k.sent[1]).toMatchObject({ op: 'answer', card_id: 'pd-1', answer: 'once' });
    const failed = actions.find(a => a.type === 'answer-failed') as Extract<Action, { type: 'answer-failed' }>;
    expect(failed.error.code).toBe('CONFLICT');
    expect(k.sent[2].op).toBe('snapshot');
  });

  it('entries accept the {entries, more} reply', async () => {
    const k = new FakeKernel(true, true, 'perCommTarget', req => req.op === 'entries'
      ? { id: req.id, ok: true, data: { entries: [{ seq: 3 }], more: false } } : { id: req.id, ok: true, data: snapshot() });
    const { actions, dispatch } = collect();
    const link = new KernelLink(k, dispatch);
    await link.connect();
    await link.entries('run-1', 20);
    expect(k.sent[1]).toMatchObject({ op: 'entries', run_id: 'run-1', limit: 20 });
    expect(actions.at(-1)).toEqual({ type: 'entries', runId: 'run-1', entries: [{ seq: 3 }] });
  });
});

describe('PanelClient', () => {
  it('a request without a reply times out with PANEL_TIMEOUT; a late reply is ignored', async () => {
    const sent: Record<string, unknown>[] = [];
    const client = new PanelClient({ send: d => sent.push(d), close: () => {} }, () => {}, 20);
    const p = client.request('verify');
    await expect(p).rejects.toMatchObject({ code: 'PANEL_TIMEOUT' });
    client.handle({ id: sent[0].id, ok: true, data: 1 }); // no throw
  });

  it('a closed comm fails every waiting request and every later one with PANEL_CLOSED', async () => {
    const client = new PanelClient({ send: () => {}, close: () => {} }, () => {});
    const p = client.snapshot();
    client.handleClose();
    await expect(p).rejects.toBeInstanceOf(PanelError);
    await expect(client.snapshot()).rejects.toMatchObject({ code: 'PANEL_CLOSED' });
  });

  it('replies are matched by id, whatever their order', async () => {
    const sent: Record<string, unknown>[] = [];
    const client = new PanelClient({ send: d => sent.push(d), close: () => {} }, () => {});
    const a = client.request('snapshot');
    const b = client.request('verify');
    client.handle({ id: sent[1].id, ok: true, data: 'B' });
    client.handle({ id: sent[0].id, ok: true, data: 'A' });
    expect(await a).toBe('A');
    expect(await b).toBe('B');
    expect(sent[0].id).not.toBe(sent[1].id);
  });
});

describe('KernelLink, a kernel with the target and no home open yet', () => {
  it('stays connected, shows the error, and the next change notice brings the snapshot', async () => {
    let homeOpen = false;
    const k = new FakeKernel(true, true, 'perCommTarget', req => homeOpen
      ? { id: req.id, ok: true, data: snapshot() }
      : { id: req.id, ok: false, error: { code: 'CONFLICT', message: 'no home is open in this kernel' } });
    const { actions, dispatch } = collect();
    const link = new KernelLink(k, dispatch);
    await link.connect();
    expect(actions.map(a => a.type)).toEqual(['connecting', 'connected', 'snapshot-failed']);
    expect(link.connected).toBe(true);
    homeOpen = true;
    k.comm.onMsg({ content: { data: { event: 'changed', version: 1 } } });
    await new Promise(r => setTimeout(r, 10));
    expect(actions.at(-1)!.type).toBe('snapshot');
  });
});
