// Reading Prometheus text as a scraper would: the tests of /metrics check samples by name and labels.

interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

function samples(text: string): Sample[] {
  const found: Sample[] = [];
  for (const line of text.split('\n')) {
    const m = /^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m) continue;
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]!] = l[2]!;
    found.push({ name: m[1]!, labels, value: Number(m[3]) });
  }
  return found;
}

const matching = (text: string, name: string, labels: Record<string, string>) =>
  samples(text).filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v));

/** The value of the first sample of `name` with (at least) these labels, or undefined. */
export function sample(text: string, name: string, labels: Record<string, string> = {}): number | undefined {
  return matching(text, name, labels)[0]?.value;
}

/** The sum of every sample of `name` with (at least) these labels: 0 when there is none. */
export function sampleSum(text: string, name: string, labels: Record<string, string> = {}): number {
  return matching(text, name, labels).reduce((n, s) => n + s.value, 0);
}
