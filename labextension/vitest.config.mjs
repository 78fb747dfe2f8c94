import os from 'node:os';
import path from 'node:path';
import { defineConfig } from 'vitest/config';

export default defineConfig({
  // Outside labextension/: a test run must not make the prebuilt panel look stale to the wheel build.
  cacheDir: path.join(os.tmpdir(), 'apollia-nb-panel-vite'),
  test: {
    environment: 'jsdom',
    include: ['test/**/*.test.ts']
  }
});
