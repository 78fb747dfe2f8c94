// What the browser tests' drivers share (tests/lab_panel_browser.mjs, tests/lab_panel_four_eyes.mjs):
// Debian's Chromium through playwright-core with a new profile, and a notebook of a running
// JupyterLab opened as a person opens it, its kernel idle.
//
// Inputs (environment): PLAYWRIGHT_CORE (the package's folder), USER_DATA_DIR (new, empty),
// LAB_URL (ends with /), LAB_TOKEN.
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);

/** A headless Chromium with a new profile: its context, and the page every step waits on for `stepMs` at most. */
export async function openBrowser(env, stepMs) {
  const { chromium } = require(env.PLAYWRIGHT_CORE);
  const context = await chromium.launchPersistentContext(env.USER_DATA_DIR, {
    executablePath: '/usr/bin/chromium',
    headless: true,
    viewport: { width: 1500, height: 1000 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync']
  });
  const page = context.pages()[0] ?? (await context.newPage());
  page.setDefaultTimeout(stepMs);
  return { context, page };
}

/** Open `notebook` (a path under the server's root) and wait until it is the current tab with an idle
 * kernel and its cells shown. */
export async function openNotebook(page, env, notebook) {
  await page.goto(`${env.LAB_URL}lab/tree/${notebook}?token=${env.LAB_TOKEN}`);
  await page.waitForFunction(path => {
    const nb = window.jupyterapp?.shell?.currentWidget;
    return nb?.context?.path === path && nb?.sessionContext?.session?.kernel?.status === 'idle' &&
      nb.node.querySelector('.jp-Notebook .jp-CodeCell');
  }, notebook);
}

/** JupyterLab asks a new profile once whether to fetch its news: say no, as a first-time user would. */
export async function declineNews(page) {
  await page.locator('.Toastify__toast').filter({ hasText: 'official Jupyter news' }).getByRole('button', { name: 'No' })
    .click({ timeout: 10_000 }).catch(() => {});
}
