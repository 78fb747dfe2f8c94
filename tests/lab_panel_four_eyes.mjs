// Four eyes in the apollia panel, in Debian's Chromium through playwright-core: a notebook whose kernel
// joined a served home opens the panel, which says who answers from it; the card of a run its own
// person started shows why it may not approve instead of the approving buttons; the card of a run
// another person started is approved by a click. Run by tests/test_lab_panel_four_eyes_browser.py,
// which checks what this prints: one JSON object on its last line of stdout.
//
// Inputs (environment): LAB_URL (ends with /), LAB_TOKEN, NOTEBOOK, PLAYWRIGHT_CORE, USER_DATA_DIR,
// ARTIFACTS, OTHERS_CARD (the card of the run another person started), OWN_CARD (the card of the
// run this kernel's person started).
import path from 'node:path';
import { declineNews, openBrowser, openNotebook } from './lab_browser.mjs';

const env = process.env;
const out = { steps: [] };
const step = name => out.steps.push(name);

const { context, page } = await openBrowser(env, 90_000);
const panel = page.locator('#apollia-panel');
const cardOf = id => panel.locator(`article[data-card-id="${id}"]`);
const answersOf = id => cardOf(id).locator('button[data-answer]').evaluateAll(bs => bs.map(b => b.getAttribute('data-answer')));

try {
  await openNotebook(page, env, env.NOTEBOOK);
  await declineNews(page);
  await page.evaluate(() => window.jupyterapp.commands.execute('notebook:run-all-cells'));
  await page.waitForFunction(() => {
    const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputArea-prompt')];
    return prompts.length > 0 && prompts.every(p => /\[\d+\]/.test(p.textContent ?? ''));
  });
  out.cells = await page.locator('.jp-Notebook .jp-CodeCell .jp-Cell-outputArea').allInnerTexts();
  step('notebook run: the kernel joined the served home');

  await page.evaluate(() => window.jupyterapp.commands.execute('apollia:open-panel'));
  await panel.waitFor({ state: 'visible' });
  // Opened before the kernel opened its home: the panel says so and offers to connect again.
  await panel.getByRole('button', { name: 'Connect to the kernel again' }).click({ timeout: 5_000 }).catch(() => {});
  await cardOf(env.OWN_CARD).waitFor();
  await cardOf(env.OTHERS_CARD).waitFor();
  out.me = await panel.locator('.apollia-me').innerText();
  out.ownWhy = await cardOf(env.OWN_CARD).locator('.apollia-may-not').innerText();
  out.ownAnswers = await answersOf(env.OWN_CARD);
  out.othersWhy = await cardOf(env.OTHERS_CARD).locator('.apollia-may-not').count();
  out.othersAnswers = await answersOf(env.OTHERS_CARD);
  await panel.screenshot({ path: path.join(env.ARTIFACTS, 'panel-four-eyes.png') }).catch(() => {});
  step('the panel says who answers from it, and why one card is not theirs to approve');

  await cardOf(env.OTHERS_CARD).locator('button[data-answer="once"]').click();
  await page.waitForFunction(id => {
    const card = document.querySelector(`#apollia-panel article[data-card-id="${id}"]`);
    return !card || card.classList.contains('apollia-card-answered');
  }, env.OTHERS_CARD);
  out.othersError = await cardOf(env.OTHERS_CARD).locator('.apollia-card-error').count();
  step('the other person\'s run approved by a click');

  await cardOf(env.OWN_CARD).locator('button[data-answer="refuse"]').click();
  await page.waitForFunction(id => {
    const card = document.querySelector(`#apollia-panel article[data-card-id="${id}"]`);
    return !card || card.classList.contains('apollia-card-answered');
  }, env.OWN_CARD);
  step('the own run refused by a click');
  out.ok = true;
} catch (err) {
  out.ok = false;
  out.error = String(err && err.stack ? err.stack : err);
  out.panelText = await panel.innerText().catch(() => null);
  await page.screenshot({ path: path.join(env.ARTIFACTS, 'panel-four-eyes-failure.png') }).catch(() => {});
} finally {
  await context.close();
}
console.log(JSON.stringify(out));
process.exit(out.ok ? 0 : 1);
