// Small readers of README.md and the guides for test/readme.int.test.ts: what they show, as data.
// Each one understands only the shapes the documents use, and says nothing about ordo.
import { runInNewContext } from 'node:vm';

/** A fenced block: its language, its text, and the README line of its first code line. */
export interface Block {
  lang: string;
  code: string;
  line: number;
}

export function lineAt(markdown: string, offset: number): number {
  return markdown.slice(0, offset).split('\n').length;
}

export function fencedBlocks(markdown: string): Block[] {
  return [...markdown.matchAll(/^```(\w*)\n([\s\S]*?)^```$/gm)].map((m) => ({
    lang: m[1]!,
    code: m[2]!,
    line: lineAt(markdown, m.index) + 1,
  }));
}

/** A line split at its comment (`--` in SQL, `//` in TypeScript), ignoring markers inside quotes. */
export function splitComment(line: string, marker: '--' | '//'): [code: string, comment?: string] {
  let quote: string | undefined;
  for (let i = 0; i < line.length; i++) {
    const c = line[i]!;
    if (quote) {
      if (c === quote) quote = undefined;
    } else if (c === "'" || c === '"' || c === '`') quote = c;
    else if (line.startsWith(marker, i)) return [line.slice(0, i), line.slice(i + marker.length).trim()];
  }
  return [line];
}

/** A SQL statement and the result its line shows after `--`, such as `2` or `'INV-2026-000003'`. */
export interface SqlStatement {
  sql: string;
  shown?: string;
  line: number;
}

/** A block's statements: each ends with `;` at the end of a line, whose comment is its result. */
export function sqlStatements(block: Block): SqlStatement[] {
  const statements: SqlStatement[] = [];
  let sql = '';
  let first = 0;
  block.code.split('\n').forEach((text, i) => {
    const [code, comment] = splitComment(text, '--');
    if (code.trim() === '' && sql === '') return;
    if (sql === '') first = i;
    sql += `${code.trimEnd()}\n`;
    if (code.trimEnd().endsWith(';')) {
      statements.push({ sql: sql.trim(), shown: comment || undefined, line: block.line + first });
      sql = '';
    }
  });
  if (sql.trim() !== '') statements.push({ sql: sql.trim(), line: block.line + first });
  return statements;
}

/** A result shown in SQL: `'text'` (quotes doubled inside), `NULL`, or a number as PostgreSQL prints it. */
export function sqlValue(shown: string): string | null {
  if (/^NULL$/i.test(shown)) return null;
  const quoted = /^'((?:[^']|'')*)'$/.exec(shown);
  return quoted ? quoted[1]!.replaceAll("''", "'") : shown;
}

/** `ordo.sequences.define({ … });` and `ordo.throttles.define({ … });` calls, their options evaluated. */
export interface DefineCall {
  api: 'sequences' | 'throttles';
  options: Record<string, unknown>;
  line: number;
}

export function defineCalls(block: Block): DefineCall[] {
  return [...block.code.matchAll(/ordo\.(sequences|throttles)\.define\((\{[\s\S]*?\})\);/g)].map((m) => ({
    api: m[1] as DefineCall['api'],
    options: jsValue(m[2]!)!.value as Record<string, unknown>,
    line: block.line + lineAt(block.code, m.index) - 1,
  }));
}

/**
 * Calls whose result the README shows: `await ordo.…(…); // value`, the value also on the
 * next line alone, and `return v; // value` for an earlier `const v = await ordo.…(…);`.
 */
export interface ShownCall {
  expr: string;
  shown: string;
  line: number;
}

export function shownCalls(block: Block): ShownCall[] {
  const lines = block.code.split('\n');
  const assigned = new Map<string, string>();
  const calls: ShownCall[] = [];
  lines.forEach((text, i) => {
    const [code, comment] = splitComment(text, '//');
    const [nextCode, nextComment] = splitComment(lines[i + 1] ?? '', '//');
    const shown = comment ?? (nextCode.trim() === '' ? nextComment : undefined);
    const call = /^\s*(?:const (\w+) = )?await (ordo\..*);\s*$/.exec(code);
    if (call?.[1]) assigned.set(call[1], call[2]!);
    const returned = /^\s*return (\w+);\s*$/.exec(code)?.[1];
    const expr = call?.[2] ?? (returned === undefined ? undefined : assigned.get(returned));
    // define calls are run by defineCalls, whatever their comment says
    if (expr !== undefined && shown && !/\.define\(/.test(expr))
      calls.push({ expr, shown, line: block.line + i });
  });
  return calls;
}

/**
 * The JavaScript value a comment shows (`1`, `[{ result: null }]`), or the value before its
 * first `, ` (`100, from memory: …`); undefined for prose or a shape (`{ ran: true, value }`).
 */
export function jsValue(text: string): { value: unknown } | undefined {
  for (const candidate of [text, text.split(', ')[0]!]) {
    try {
      return { value: structuredClone(runInNewContext(`(${candidate})`, {})) };
    } catch {
      // not a value: try the next candidate
    }
  }
  return undefined;
}

/** A SQL function the README lists: its arguments (undefined for `…`) and the result after `→`. */
export interface SqlFunction {
  text: string;
  name: string;
  args?: string[];
  result?: string;
  line: number;
}

/**
 * The functions listed after "From SQL: ", "From SQL, for …: " or "SQL functions (…): ", up to
 * the end of that sentence: each `name(args)`, `SELECT ordo.name(args)` or
 * `SELECT * FROM ordo.name(args)` span, with `→ result` inside it or as the next span.
 */
export function sqlFunctions(markdown: string): SqlFunction[] {
  const found: SqlFunction[] = [];
  for (const intro of markdown.matchAll(/(?:From SQL|SQL functions)[^.:\n]{0,60}: /g)) {
    const start = intro.index + intro[0].length;
    const sentence = sentenceFrom(markdown, start);
    for (const span of sentence.matchAll(/`([^`]+)`(?:\s*→\s*`([^`]+)`)?/g)) {
      const [callText, inner] = span[1]!.split(/\s*→\s*/);
      const call = /^(?:SELECT (?:\* FROM )?)?(?:ordo\.)?(\w+)\((.*)\)$/.exec(callText!);
      if (!call) continue;
      found.push({
        text: callText!,
        name: call[1]!,
        args: call[2] === '…' ? undefined : splitTopLevel(call[2]!),
        result: inner ?? span[2],
        line: lineAt(markdown, start + span.index),
      });
    }
  }
  return found;
}

/** Text from `start` to the first `. ` (or `.` at the end of a line) outside code spans. */
function sentenceFrom(text: string, start: number): string {
  let code = false;
  for (let i = start; i < text.length; i++) {
    if (text[i] === '`') code = !code;
    else if (!code && text[i] === '.' && /\s/.test(text[i + 1] ?? ' ')) return text.slice(start, i);
  }
  return text.slice(start);
}

/** `a, f(b, c), 'd, e'` → `a`, `f(b, c)`, `'d, e'`: commas outside brackets and quotes. */
export function splitTopLevel(text: string): string[] {
  const parts: string[] = [];
  let depth = 0;
  let quote: string | undefined;
  let part = '';
  for (const c of text) {
    if (quote) quote = c === quote ? undefined : quote;
    else if (c === "'" || c === '"') quote = c;
    else if ('([{'.includes(c)) depth++;
    else if (')]}'.includes(c)) depth--;
    else if (c === ',' && depth === 0) {
      parts.push(part.trim());
      part = '';
      continue;
    }
    part += c;
  }
  if (part.trim() !== '') parts.push(part.trim());
  return parts;
}

/** The rows of the first Markdown table after `## heading`, as cells. */
export function tableAfter(markdown: string, heading: string): string[][] {
  const start = markdown.indexOf(`\n${heading}\n`);
  if (start < 0) return [];
  const rows: string[][] = [];
  for (const line of markdown.slice(start + heading.length + 2).split('\n')) {
    if (!line.startsWith('|')) {
      if (rows.length > 0) break;
      continue;
    }
    const cells = line
      .slice(1, -1)
      .split(' | ')
      .map((c) => c.trim());
    if (!cells.every((c) => /^-+$/.test(c))) rows.push(cells);
  }
  return rows.slice(1); // without the header row
}

/** GitHub's anchor for a heading: lower case, punctuation dropped, spaces as `-`. */
export function headingAnchor(heading: string): string {
  return heading
    .toLowerCase()
    .replace(/[^\p{L}\p{N}\s_-]/gu, '')
    .replace(/\s/g, '-');
}

/** A document's text without its fenced blocks, where a `#` or a `](` is code, not Markdown. */
export function prose(markdown: string): string {
  return markdown.replace(/^```[\s\S]*?^```$/gm, '');
}

/** The anchors of a document's headings, as GitHub makes them (a repeated heading gets `-1`, `-2`…). */
export function headingAnchors(markdown: string): string[] {
  const seen = new Map<string, number>();
  return [...prose(markdown).matchAll(/^#+ (.+)$/gm)].map((m) => {
    const anchor = headingAnchor(m[1]!);
    const n = seen.get(anchor) ?? 0;
    seen.set(anchor, n + 1);
    return n === 0 ? anchor : `${anchor}-${n}`;
  });
}

/**
 * The links of a document outside its fenced blocks, to one of its headings (`#anchor`) or to a
 * file of the repository (`docs/x.md`, `docs/x.md#anchor`, an image); addresses with a scheme
 * (`https:`) are left out.
 */
export interface Link {
  file?: string;
  anchor?: string;
}

export function markdownLinks(markdown: string): Link[] {
  return [...prose(markdown).matchAll(/\]\(([^)#:]*)(?:#([^)]*))?\)/g)]
    .filter((m) => m[1] !== '' || m[2] !== undefined)
    .map((m) => ({
      ...(m[1] === '' ? {} : { file: m[1]! }),
      ...(m[2] === undefined ? {} : { anchor: m[2] }),
    }));
}
