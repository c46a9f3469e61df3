// The dashboard's files as served: a script that parses and never turns text into HTML, a page
// with nothing inline for the CSP to have to allow.
import { Script } from 'node:vm';
import { describe, expect, it } from 'vitest';
import { dashboardHtml } from '../src/server/dashboard-page.js';
import { DASHBOARD_CSP } from '../src/server/dashboard-routes.js';
import { DASHBOARD_SCRIPT } from '../src/server/dashboard-script.js';

describe('the dashboard files', () => {
  it('the script parses, and builds the page with DOM calls only', () => {
    expect(() => new Script(DASHBOARD_SCRIPT)).not.toThrow();
    for (const sink of [
      'innerHTML',
      'outerHTML',
      'insertAdjacentHTML',
      'document.write',
      'eval(',
      'Function(',
    ]) {
      expect(DASHBOARD_SCRIPT, sink).not.toContain(sink);
    }
    // Attributes set from data are never ones that load or run something.
    expect(DASHBOARD_SCRIPT).not.toMatch(/setAttribute\('(href|src|on\w+)'/);
  });

  it('the page has no inline script, style or handler, and says whether a token is needed', () => {
    for (const tokens of [true, false]) {
      const html = dashboardHtml({ tokens });
      expect(html).not.toMatch(/<script>|<script [^>]*>[^<]|<style|\sstyle=|\son\w+=/i);
      expect(html).toContain(`<meta name="ordo-auth" content="${tokens ? 'bearer' : 'none'}">`);
      expect(html).toContain('<script src="dashboard.js" defer></script>');
    }
    expect(DASHBOARD_CSP).toMatch(/default-src 'self'/);
    expect(DASHBOARD_CSP).not.toMatch(/unsafe|\*|data:|https?:/);
  });
});
