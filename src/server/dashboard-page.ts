/**
 * The dashboard's page, style and icon, kept as strings so that they ship inside dist/ with
 * the rest of the server (no build step, no other files to find at run time). The script is in
 * dashboard-script.ts. Every URL is relative, so the page also works behind a proxy that
 * serves ordo under a path of its own.
 */

/**
 * The page: a token form, a status line and three empty panels the script fills. It holds no
 * data; `tokens` says whether the server asks for a token, so the page asks only when needed.
 */
export function dashboardHtml(options: { tokens: boolean }): string {
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="ordo-auth" content="${options.tokens ? 'bearer' : 'none'}">
<title>ordo dashboard</title>
<link rel="icon" href="dashboard.svg" type="image/svg+xml">
<link rel="stylesheet" href="dashboard.css">
<script src="dashboard.js" defer></script>
</head>
<body>
<header>
  <h1>ordo</h1>
  <p id="status" class="status">Loading…</p>
  <button id="forget" type="button" hidden>Forget token</button>
</header>
<p id="notice" class="notice" role="status" hidden></p>
<!-- method=post and the CSP's form-action 'none': even without script the token never lands in a URL. -->
<form id="login" class="login" method="post" hidden>
  <label for="token">Read token</label>
  <input id="token" name="token" type="password" autocomplete="off" spellcheck="false" required>
  <button type="submit">Show the dashboard</button>
  <p class="hint">A token with the <strong>read</strong> scope. It stays in this tab (session storage) and is sent
  as an <code>Authorization: Bearer</code> header, never in the address.</p>
</form>
<noscript><p class="notice">The dashboard needs JavaScript; the same data is at <code>GET /v1/dashboard</code>.</p></noscript>
<main id="panels" hidden>
  <section id="sequences" aria-labelledby="sequences-title">
    <h2 id="sequences-title">Sequences</h2>
    <div class="cards"></div>
  </section>
  <section id="outbox" aria-labelledby="outbox-title">
    <h2 id="outbox-title">Outbox</h2>
    <div class="cards"></div>
  </section>
  <section id="throttles" aria-labelledby="throttles-title">
    <h2 id="throttles-title">Throttles</h2>
    <div class="cards"></div>
  </section>
</main>
<footer id="footer"></footer>
</body>
</html>
`;
}

/**
 * Readable without colour: every state is a word (a tag), colour only repeats it. Tables
 * become label/value lines on narrow screens, and long names wrap, so a phone never scrolls
 * sideways.
 */
export const DASHBOARD_CSS = `:root {
  color-scheme: light dark;
  --bg: #f5f6f8;
  --fg: #1b1f24;
  --muted: #59626e;
  --card: #ffffff;
  --line: #d9dee4;
  --accent: #2457c5;
  --warn: #8a5300;
  --bad: #b42318;
  --good: #1a7f37;
  font-family: system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif;
}
@media (prefers-color-scheme: dark) {
  :root {
    --bg: #111418;
    --fg: #e6e9ed;
    --muted: #9aa4b0;
    --card: #1a1f25;
    --line: #2e353d;
    --accent: #7ea6ff;
    --warn: #f0b35a;
    --bad: #ff7b72;
    --good: #56d364;
  }
}
* { box-sizing: border-box; }
html { -webkit-text-size-adjust: 100%; text-size-adjust: 100%; }
body { margin: 0; background: var(--bg); color: var(--fg); font-size: 15px; line-height: 1.45; overflow-wrap: break-word; }
header {
  display: flex; flex-wrap: wrap; align-items: baseline; gap: 0.25rem 1rem;
  padding: 0.6rem 1rem; background: var(--card); border-bottom: 1px solid var(--line);
}
h1 { font-size: 1.15rem; margin: 0; }
.status { margin: 0; color: var(--muted); font-size: 0.875rem; flex: 1 1 14rem; }
.notice { margin: 0.75rem; padding: 0.6rem 0.8rem; border: 1px solid var(--warn); border-left-width: 4px; border-radius: 6px; background: var(--card); }
.login { max-width: 28rem; margin: 1.5rem auto; padding: 1rem; background: var(--card); border: 1px solid var(--line); border-radius: 8px; display: grid; gap: 0.5rem; }
.login label { font-weight: 600; }
.hint { color: var(--muted); font-size: 0.85rem; margin: 0; }
input, button { font: inherit; }
input { width: 100%; padding: 0.45rem 0.6rem; border: 1px solid var(--line); border-radius: 6px; background: var(--bg); color: var(--fg); }
button { padding: 0.4rem 0.9rem; border: 1px solid var(--accent); border-radius: 6px; background: var(--accent); color: #fff; cursor: pointer; }
header button { background: transparent; color: var(--accent); padding: 0.15rem 0.6rem; font-size: 0.85rem; }
main { padding: 0.75rem; display: grid; gap: 1.25rem; }
section > h2 { font-size: 1.05rem; margin: 0 0.25rem 0.5rem; }
.cards { display: grid; gap: 0.75rem; grid-template-columns: repeat(auto-fill, minmax(min(100%, 30rem), 1fr)); }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 0.75rem; min-width: 0; overflow-wrap: anywhere; }
.card h3 { margin: 0 0 0.25rem; font-size: 1rem; display: flex; flex-wrap: wrap; align-items: center; gap: 0.25rem 0.5rem; }
.card h4 { margin: 0.75rem 0 0.25rem; font-size: 0.9rem; }
.tag { font-size: 0.72rem; font-weight: 700; letter-spacing: 0.03em; text-transform: uppercase; border: 1px solid currentColor; border-radius: 999px; padding: 0 0.5rem; color: var(--muted); }
.tag.good { color: var(--good); }
.tag.warn { color: var(--warn); }
.tag.bad { color: var(--bad); }
.def, .empty, .more { color: var(--muted); font-size: 0.875rem; margin: 0.25rem 0; }
dl.facts { display: grid; grid-template-columns: max-content minmax(0, 1fr); gap: 0.1rem 0.75rem; margin: 0.5rem 0; font-size: 0.9rem; }
dl.facts dt { color: var(--muted); }
dl.facts dd { margin: 0; }
.spark-row { display: flex; align-items: center; gap: 0.5rem; margin: 0.5rem 0; }
svg.spark { flex: 1 1 auto; min-width: 0; width: 100%; height: 2rem; border-bottom: 1px solid var(--line); overflow: visible; }
svg.spark path { fill: none; stroke: var(--accent); stroke-width: 1.5; vector-effect: non-scaling-stroke; }
.spark-caption { font-size: 0.75rem; color: var(--muted); flex: none; max-width: 45%; text-align: right; }
.table-wrap { overflow-x: auto; margin: 0.5rem 0; }
table { width: 100%; border-collapse: collapse; font-size: 0.85rem; }
caption { text-align: left; font-weight: 600; padding: 0.25rem 0; }
th, td { text-align: left; padding: 0.25rem 0.4rem; border-bottom: 1px solid var(--line); vertical-align: top; }
th { color: var(--muted); font-weight: 600; white-space: nowrap; }
.num { text-align: right; font-variant-numeric: tabular-nums; }
td.num, td.short { white-space: nowrap; overflow-wrap: normal; }
.blocker { margin: 0.5rem 0; padding: 0.4rem 0.6rem; border: 1px solid var(--line); border-left-width: 4px; border-radius: 6px; }
.blocker.holding { border-color: var(--warn); }
.blocker p { margin: 0.15rem 0; }
meter { width: 4.5rem; vertical-align: middle; margin-right: 0.35rem; }
details { margin: 0.5rem 0; }
summary { cursor: pointer; font-weight: 600; font-size: 0.9rem; }
ol.letters { margin: 0.25rem 0; padding-left: 1.25rem; font-size: 0.85rem; }
ol.letters li { margin: 0.35rem 0; }
ol.letters p { margin: 0.1rem 0; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 0.85em; }
footer { padding: 0.5rem 1rem 1rem; color: var(--muted); font-size: 0.8rem; }
[hidden] { display: none !important; }
@media (max-width: 40rem) {
  body { font-size: 14px; }
  main { padding: 0.5rem; }
  table.stack thead { position: absolute; width: 1px; height: 1px; overflow: hidden; clip-path: inset(50%); }
  table.stack tr { display: block; padding: 0.3rem 0; border-bottom: 1px solid var(--line); }
  table.stack td { display: flex; gap: 0.5rem; border: 0; padding: 0.05rem 0; text-align: left; white-space: normal; }
  table.stack td::before { content: attr(data-label); color: var(--muted); flex: 0 0 6.5rem; }
}
`;

/** Three bars rising: the tab's icon, so the browser asks for nothing it is not given. */
export const DASHBOARD_ICON = `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32"><rect width="32" height="32" rx="6" fill="#2457c5"/><path d="M7 24h5V15H7zm6.5 0h5V10h-5zm6.5 0h5V6h-5z" fill="#fff"/></svg>
`;
