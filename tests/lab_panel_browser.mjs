// Drives Debian's Chromium through playwright-core against a running JupyterLab, as a person
// would use the apollia panel: opens the notebook, opens the panel with its shortcut, runs
// every cell, answers `once` in the panel while the cell that awaits the task is busy, and
// reads back what the page shows. Run by tests/test_lab_panel_browser.py, which starts the
// server and checks what this prints: one JSON object on its last line of stdout.
//
// Inputs (environment): LAB_URL (ends with /), LAB_TOKEN, NOTEBOOK (a path under the root),
// PLAYWRIGHT_CORE (the package's folder), USER_DATA_DIR (new, empty), ARTIFACTS (a folder).
import path from 'node:path';
import { declineNews, openBrowser, openNotebook } from './lab_browser.mjs';

const env = process.env;
const STEP_MS = 90_000;
const out = { steps: [] };
const step = name => out.steps.push(name);

const { context, page } = await openBrowser(env, STEP_MS);
const consoleErrors = [];
page.on('console', m => { if (m.type() === 'error') consoleErrors.push(m.text()); });
const panel = page.locator('#apollia-panel');
// Every notification the page shows, kept as it appears: a toast closes by itself after a while,
// so what was shown is read from this record, not from whatever toasts are still on screen.
await context.addInitScript(() => {
  const shown = window.__apolliaToasts = [];
  const seen = new WeakSet();
  const record = () => {
    for (const toast of document.querySelectorAll('.Toastify__toast')) {
      if (!seen.has(toast) && toast.textContent) {
        seen.add(toast);
        shown.push(toast.innerText || toast.textContent);
      }
    }
  };
  new MutationObserver(record).observe(document, { childList: true, subtree: true, characterData: true });
});
/** The text of every notification shown so far, in order. */
const toastsShown = () => page.evaluate(() => [...window.__apolliaToasts]);

/** axe-core's WCAG 2 A/AA rules over the panel, in the page as it is now: violations with their nodes. */
async function axe() {
  if (!(await page.evaluate(() => Boolean(window.axe)))) {
    await page.addScriptTag({ path: env.AXE });
  }
  return page.evaluate(async () => {
    const r = await window.axe.run('#apollia-panel', { runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa'] } });
    return {
      passes: r.passes.length,
      violations: r.violations.map(v => ({ id: v.id, help: v.help, nodes: v.nodes.slice(0, 5).map(n => ({
        target: n.target.join(' '), summary: n.failureSummary })) }))
    };
  });
}

async function screenshot(name) {
  const file = path.join(env.ARTIFACTS, name);
  await panel.screenshot({ path: file }).catch(() => page.screenshot({ path: file }));
  return file;
}

/** The text of a code cell's outputs and its prompt ("[*]:" while it runs), by index among code cells. */
async function cell(index) {
  return page.evaluate(i => {
    const cells = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')];
    const c = cells[i];
    return c ? {
      prompt: c.querySelector('.jp-InputArea-prompt')?.textContent ?? '',
      output: c.querySelector('.jp-Cell-outputArea')?.textContent ?? ''
    } : null;
  }, index);
}

async function waitCell(index, predicate, what) {
  const end = Date.now() + STEP_MS;
  let said = 0;
  for (;;) {
    const c = await cell(index);
    if (Date.now() - said > 5000) {
      said = Date.now();
      process.stderr.write(`waiting (${what}): cell ${index} ${JSON.stringify(c)?.slice(0, 300)}\n`);
    }
    if (c && predicate(c)) {
      return c;
    }
    if (Date.now() > end) {
      throw new Error(`${what}: cell ${index} shows ${JSON.stringify(c)}`);
    }
    await page.waitForTimeout(200);
  }
}

try {
  await openNotebook(page, env, env.NOTEBOOK);
  step('notebook open, kernel idle');
  await declineNews(page);
  out.command = await page.evaluate(() => ({
    has: window.jupyterapp.commands.hasCommand('apollia:open-panel'),
    label: window.jupyterapp.commands.label('apollia:open-panel'),
    keys: window.jupyterapp.commands.keyBindings
      .filter(b => b.command === 'apollia:open-panel').map(b => b.keys.join(' '))
  }));

  // The shortcut opens the panel; the kernel has not loaded the extension yet.
  await page.locator('.jp-Notebook').click({ position: { x: 5, y: 5 } });
  await page.keyboard.press('Escape');
  await page.keyboard.press('Alt+Shift+P');
  await panel.waitFor({ state: 'visible' });
  await panel.locator('.apollia-not-loaded').waitFor();
  out.notLoaded = await panel.locator('.apollia-not-loaded').innerText();
  step('panel open by its shortcut, says how to load the extension');

  // The cells up to the second task first: the first card is alone in the panel's snapshot, so it gets
  // a notification of its own (cards that arrive together share one); then the rest, not awaited:
  // running them ends only when the cell awaiting the task ends.
  const secondTask = Number(env.SECOND_TASK_CELL);
  await page.evaluate(i => {
    const nb = window.jupyterapp.shell.currentWidget;
    nb.content.activeCellIndex = i;
    void window.jupyterapp.commands.execute('notebook:run-all-above');
  }, secondTask);
  await page.waitForFunction(goal => window.__apolliaToasts.some(t => t.includes(goal)), env.GOAL_1);
  await page.evaluate(i => {
    const nb = window.jupyterapp.shell.currentWidget;
    nb.content.activeCellIndex = i;
    void window.jupyterapp.commands.execute('notebook:run-all-below');
  }, secondTask);
  step('run all cells, the first task\'s card notified before the second task starts');
  const waitingCards = panel.locator('article[data-card-id]:not(.apollia-card-answered)');
  await page.waitForFunction(() => document.querySelectorAll('#apollia-panel article[data-card-id]:not(.apollia-card-answered)').length >= 2);
  const busyCell = Number(env.AWAIT_CELL);
  // The cell awaiting the first task is busy, and stays busy until its card is answered.
  const busy = await waitCell(busyCell, c => c.prompt.includes('*'), 'the awaiting cell never ran');
  out.busyBeforeClick = (await cell(busyCell)).prompt;
  out.cards = await waitingCards.evaluateAll(nodes => nodes.map(n => ({
    goal: n.querySelector('.apollia-goal')?.textContent, ids: n.querySelector('.apollia-ids')?.textContent
  })));
  const first = panel.locator('article[data-card-id]').filter({ hasText: env.GOAL_1 });
  out.cardText = await first.innerText();
  out.badge = await page.locator('.lm-TabBar-tab.apollia-tab-waiting').getAttribute('data-apollia-waiting').catch(() => null);
  out.badgeStyle = await page.locator('.lm-TabBar-tab.apollia-tab-waiting').evaluate(tab => {
    const s = getComputedStyle(tab, '::before');
    return { content: s.content, width: parseFloat(s.width), height: parseFloat(s.height), current: tab.classList.contains('lm-mod-current') };
  });
  const toasts = () => page.locator('.Toastify__toast').allInnerTexts();
  await page.waitForFunction(goal => window.__apolliaToasts.some(t => t.includes(goal)), env.GOAL_2);
  out.toastsBeforeAnswer = await toastsShown();
  out.notification = out.toastsBeforeAnswer.find(t => t.includes(env.GOAL_1)) ?? null;
  out.axeLight = await axe();
  out.screenshotWaiting = await screenshot('panel-waiting.png');
  step(`two cards waiting in the panel while the cell is busy (${busy.prompt.trim()})`);

  await first.locator('button[data-answer="once"]').click();
  out.busyAtClick = (await cell(busyCell)).prompt;
  await panel.locator('.apollia-card-answered').first().waitFor();
  out.panelAnswered = await panel.locator('.apollia-card-answered .apollia-answered').first().innerText();
  await page.waitForFunction(goal => ![...document.querySelectorAll('.Toastify__toast')].some(t => t.textContent.includes(goal)),
    env.GOAL_1.slice(0, 30), { timeout: 5000 }).catch(() => {});
  out.toastsAfterAnswer = await toasts();
  step('answered once in the panel');

  const done = await waitCell(busyCell, c => !c.prompt.includes('*') && c.output.includes('RUN'), 'the run did not finish');
  out.awaitOutput = done.output;
  const viewCell = Number(env.TASK_CELL);
  const view = await waitCell(viewCell, c => /Answered/.test(c.output), 'the cell card never showed the answer');
  out.cellCard = view.output;
  step('the busy cell finished, its card shows the answer');

  // The plan: waits in the panel while the next cell blocks its thread in join().
  const plan = panel.locator('article[data-plan-id]');
  await plan.waitFor();
  const joinCell = Number(env.JOIN_CELL);
  await waitCell(joinCell, c => c.prompt.includes('*'), 'the join cell never ran');
  out.planGoal = await plan.locator('.apollia-goal').innerText();
  out.planBadge = await page.locator('.lm-TabBar-tab.apollia-tab-waiting').getAttribute('data-apollia-waiting').catch(() => null);
  out.runsWhilePlanWaits = await panel.locator('.apollia-runs').first().innerText();
  await plan.locator('textarea').fill('Check that the notes are tidy');
  out.joinBusyAtApprove = (await cell(joinCell)).prompt;
  await plan.locator('button[data-answer="approve"]').click();
  const joined = await waitCell(joinCell, c => !c.prompt.includes('*') && c.output.includes('PLAN'), 'the plan task did not finish');
  out.joinOutput = joined.output;
  const sql = await waitCell(Number(env.SQL_CELL), c => !c.prompt.includes('*') && c.prompt.trim() !== '[ ]:' && c.output.length > 0,
    'the SQL cell did not run');
  out.sqlOutput = sql.output;
  step('the plan approved (edited) in the panel while the cell blocked in join()');

  // The verification badge follows the journal with no click, and never claims more than it checked.
  out.verifyClaims = [];
  const end = Date.now() + 30_000;
  for (;;) {
    const [badge, size] = await panel.evaluate(node => [node.querySelector('.apollia-verify')?.textContent ?? '',
      node.querySelector('.apollia-journal-size')?.textContent ?? '']);
    const claim = /verified: all (\d+) entries|verified (\d+) of/.exec(badge);
    if (claim) {
      out.verifyClaims.push([claim[1] ?? claim[2], size]);
    }
    if (badge === `verified: all ${size} entries`) {
      out.verifyFollowed = badge;
      out.journalSize = size;
      break;
    }
    if (Date.now() > end) {
      out.verifyFollowed = badge;
      out.journalSize = size;
      break;
    }
    await page.waitForTimeout(250);
  }
  step('the verification followed the journal');

  // The journal: the first run's entries, as the panel lists them on a click (folded under "Show … finished").
  await panel.locator('.apollia-finished-toggle').click();
  const run = panel.locator('.apollia-finished .apollia-run-open').filter({ hasText: env.GOAL_1 });
  out.runButton = await run.getAttribute('aria-label');
  await run.click();
  await panel.locator('.apollia-run-entries').waitFor();
  await page.waitForFunction(() => document.querySelector('#apollia-panel .apollia-run-entries')?.textContent.includes('answer=once'));
  out.runEntries = await panel.locator('.apollia-run-entries').innerText();
  await panel.locator('button[aria-label="Verify the journal now"]').click();
  await page.waitForFunction(() => {
    const size = document.querySelector('#apollia-panel .apollia-journal-size')?.textContent;
    return document.querySelector('#apollia-panel .apollia-verify-ok')?.textContent === `verified: all ${size} entries`;
  });
  out.journal = await panel.locator('.apollia-journal').innerText();
  await panel.evaluate(node => { node.scrollTop = 0; });
  out.screenshot = await screenshot('panel.png');
  step('the run\'s journal entries hold the answer');

  // The dark theme: the panel's colours follow JupyterLab's theme variables, and pass AA contrast.
  const colours = () => panel.evaluate(node => {
    const card = node.querySelector('.apollia-card');
    return [getComputedStyle(node).backgroundColor, getComputedStyle(node).color, card && getComputedStyle(card).backgroundColor];
  });
  out.lightColours = await colours();
  await page.evaluate(() => window.jupyterapp.commands.execute('apputils:change-theme', { theme: 'JupyterLab Dark' }));
  await page.waitForFunction(() => document.body.dataset.jpThemeLight === 'false');
  await page.waitForTimeout(500);
  out.darkColours = await colours();
  out.axeDark = await axe();
  out.screenshotDark = await screenshot('panel-dark.png');
  step('dark theme');

  // The last card: refused in the panel; nothing waits, the badge goes.
  await panel.locator('article[data-card-id]:not(.apollia-card-answered)').filter({ hasText: env.GOAL_2 })
    .locator('button[data-answer="refuse"]').click();
  await page.waitForFunction(() => !document.querySelector('.lm-TabBar-tab.apollia-tab-waiting'));
  out.badgeAfterAll = await page.locator('.lm-TabBar-tab.apollia-tab-waiting').count().then(n => n ? 'still there' : null);
  step('every question answered');

  // A kernel that joined `apollia-os serve`: the server task's card, clicked in its cell.
  await openNotebook(page, env, env.SERVED_NOTEBOOK);
  await page.evaluate(() => { void window.jupyterapp.commands.execute('notebook:run-all-cells'); });
  // Both notebooks are in the page (one tab hidden): look in the current one only.
  const servedId = await page.evaluate(() => window.jupyterapp.shell.currentWidget.id);
  const servedCell = page.locator(`[id="${servedId}"] .jp-Notebook .jp-CodeCell`).nth(2);
  const servedOnce = servedCell.locator('.jp-OutputArea button', { hasText: 'once' });
  await servedOnce.waitFor();
  await servedOnce.click();
  await page.waitForFunction(id => {
    const c = document.getElementById(id)?.querySelectorAll('.jp-Notebook .jp-CodeCell')[2];
    return c && /Answered/.test(c.textContent) && /completed/.test(c.textContent);
  }, servedId);
  out.servedOutput = await servedCell.locator('.jp-OutputArea').innerText();
  if (!(await panel.isVisible())) {
    await page.evaluate(() => window.jupyterapp.commands.execute('apollia:open-panel'));
  }
  await panel.locator('.apollia-banner').waitFor({ timeout: 30_000 });
  out.axeServed = await axe();
  out.screenshotServed = await screenshot('panel-served.png');
  step('the served kernel\'s card answered by a click');
  out.ok = true;
} catch (err) {
  out.ok = false;
  out.error = String(err && err.stack ? err.stack : err);
  out.panelText = await panel.innerText().catch(() => null);
  out.screenshot = await page.screenshot({ path: path.join(env.ARTIFACTS, 'panel-failure.png') })
    .then(() => path.join(env.ARTIFACTS, 'panel-failure.png')).catch(() => null);
} finally {
  out.consoleErrors = consoleErrors.slice(0, 20);
  await context.close();
}
console.log(JSON.stringify(out));
process.exit(out.ok ? 0 : 1);
