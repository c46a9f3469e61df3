import { parseArgs } from 'node:util';
import { envDatabaseUrl } from '../config.js';
import { createOrdo, type Ordo, OrdoError } from '../index.js';

const USAGE = `ordo — numbers and order you can trust on PostgreSQL

Usage:
  ordo migrate                     apply ordo's migrations
  ordo status [--json]             sequences with their current values per scope and period
  ordo next <name> [--scope s] [--count n] [--at time] [--json]
                                   take the next value(s) of a sequence
  ordo sql "<statements>" [--json] run SurrealQL-compatible statements, e.g.
                                   "DEFINE SEQUENCE ids BATCH 1000 START 100 TIMEOUT 5s; sequence::nextval('ids');"

Options for every command:
  --database-url URL   PostgreSQL to use (default: ORDO_DATABASE_URL, DATABASE_URL)
  --data-dir DIR       with no URL, the embedded PostgreSQL's directory (default .ordo/pg)
  --schema NAME        ordo's schema (default ordo)
  -h, --help           this help
`;

const OPTIONS = {
  'database-url': { type: 'string' },
  'data-dir': { type: 'string' },
  schema: { type: 'string' },
  scope: { type: 'string' },
  count: { type: 'string' },
  at: { type: 'string' },
  json: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
} as const;

type Flags = ReturnType<typeof parse>['values'];

function parse(argv: string[]) {
  return parseArgs({ args: argv, options: OPTIONS, allowPositionals: true, strict: true });
}

async function open(flags: Flags): Promise<Ordo> {
  const url = flags['database-url'] ?? envDatabaseUrl();
  const schema = flags.schema;
  return url
    ? createOrdo({ databaseUrl: url, schema, poolSize: 2 })
    : createOrdo({ embedded: { dataDir: flags['data-dir'] ?? '.ordo/pg' }, schema, poolSize: 2 });
}

const COMMANDS: Record<string, (ordo: Ordo, args: string[], flags: Flags) => Promise<number | void>> = {
  async migrate() {
    console.log('ordo: schema is up to date');
  },

  async status(ordo, _args, flags) {
    const rows = await ordo.sequences.status();
    if (flags.json) return console.log(JSON.stringify(rows, null, 2));
    if (rows.length === 0) return console.log('no sequences defined');
    console.table(
      rows.map((r) => ({
        sequence: r.name,
        reset: r.reset,
        scope: r.scope ?? '',
        period: r.period ?? '',
        value: r.value ?? '',
      })),
    );
  },

  async next(ordo, args, flags) {
    const [name] = args;
    if (!name || args.length > 1)
      throw new OrdoError('invalid_argument', 'usage: ordo next <name> [--scope s] [--count n]');
    const count = flags.count === undefined ? 1 : Number(flags.count);
    const opts = { scope: flags.scope, at: flags.at };
    const issued =
      count === 1 && flags.count === undefined
        ? [await ordo.sequences.next(name, opts)]
        : await ordo.sequences.nextMany(name, count, opts);
    if (flags.json) return console.log(JSON.stringify(issued));
    for (const i of issued) console.log(i.text);
  },
};

async function sql(ordo: Ordo, args: string[], flags: Flags): Promise<number> {
  if (args.length !== 1) throw new OrdoError('invalid_argument', 'usage: ordo sql "<statements>" [--json]');
  const results = await ordo.query(args[0]!);
  if (flags.json) console.log(JSON.stringify(results));
  else {
    for (const r of results) {
      if ('error' in r) console.log(`error (${r.code}): ${r.error}`);
      else console.log(JSON.stringify(r.result));
    }
  }
  // Like a shell running several commands: fail when any statement failed.
  return results.some((r) => 'error' in r) ? 1 : 0;
}

export async function main(argv: string[]): Promise<number> {
  let parsed: ReturnType<typeof parse>;
  try {
    parsed = parse(argv);
  } catch (e) {
    console.error(`ordo: ${(e as Error).message}`);
    return 2;
  }
  const [command, ...args] = parsed.positionals;
  if (parsed.values.help || !command) {
    console.log(USAGE);
    return command || parsed.values.help ? 0 : 2;
  }
  const run = command === 'sql' ? sql : COMMANDS[command];
  if (!run) {
    console.error(`ordo: unknown command '${command}' (try ordo --help)`);
    return 2;
  }
  let ordo: Ordo | undefined;
  try {
    ordo = await open(parsed.values);
    return (await run(ordo, args, parsed.values)) ?? 0;
  } catch (e) {
    const code = e instanceof OrdoError ? e.code : 'error';
    console.error(`ordo: ${code}: ${(e as Error).message}`);
    return 1;
  } finally {
    await ordo?.close();
  }
}
