/** The report: JSON as produced by the runner, a readable HTML page, and a Markdown summary. */

import type { CaseResult, RunReport } from './runner.js';

const esc = (s: string): string => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');

const COLOR: Record<string, string> = {
  pass: '#1a7f37', deviation: '#bf8700', 'peer-stopped': '#cf222e', 'not-applicable': '#6e7781', error: '#8250df',
};

export function toJson(reports: RunReport | readonly RunReport[]): string {
  return JSON.stringify(reports, null, 2) + '\n';
}

export function toHtml(reports: readonly RunReport[], title = 'RoCEv2 conformance report'): string {
  const out: string[] = [
    '<!doctype html><html><head><meta charset="utf-8">',
    `<title>${esc(title)}</title>`,
    '<style>body{font:14px system-ui,sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;width:100%}',
    'td,th{border:1px solid #d0d7de;padding:4px 6px;vertical-align:top;text-align:left}th{background:#f6f8fa}',
    '.v{font-weight:600;white-space:nowrap}pre{white-space:pre-wrap;font-size:12px;margin:0}details{margin-top:4px}</style></head><body>',
    `<h1>${esc(title)}</h1>`,
  ];
  for (const r of reports) {
    out.push(`<h2>exchange ${esc(r.exchange)} — peer ${esc(r.peer)}</h2>`);
    out.push(`<p>${esc(r.startedAt)}, ${(r.durationMs / 1000).toFixed(1)} s. ` +
      Object.entries(r.counts).map(([k, v]) => `<span style="color:${COLOR[k]}">${esc(k)}: ${v}</span>`).join(' · ') + '</p>');
    if (r.session) out.push(`<p>session: <code>${esc(JSON.stringify(r.session))}</code></p>`);
    out.push('<table><tr><th>case</th><th>IBTA rule</th><th>expected</th><th>verdict</th><th>observed</th></tr>');
    for (const c of r.cases) out.push(row(c));
    out.push('</table>');
  }
  out.push('</body></html>');
  return out.join('\n') + '\n';
}

function row(c: CaseResult): string {
  let obs = esc(c.observed);
  if (c.notes.length) obs += '<br><small>' + c.notes.map(esc).join('<br>') + '</small>';
  if (c.liveness !== 'ok' && c.liveness !== 'skipped') obs += `<br><small>liveness: ${esc(c.liveness)}</small>`;
  if (c.pcap) obs += `<br><small>pcap: <a href="${esc(c.pcap)}">${esc(c.pcap)}</a></small>`;
  if (c.packets?.length) {
    obs += '<details><summary>packets</summary><pre>' +
      c.packets.map((p) => `${p.atMs.toFixed(1).padStart(9)} ms ${p.dir === 'tx' ? '→' : '←'} ${esc(p.summary)}`).join('\n') + '</pre></details>';
  }
  return `<tr><td><b>${esc(c.id)}</b><br>${esc(c.title)}</td><td>${esc(c.rule)}</td><td>${esc(c.expected)}</td>` +
    `<td class="v" style="color:${COLOR[c.verdict]}">${esc(c.verdict)}</td><td>${obs}</td></tr>`;
}

/** A Markdown table per run (for CONFORMANCE.md); `explain` adds a sentence per deviation. */
export function toMarkdown(reports: readonly RunReport[], explain: (r: RunReport, c: CaseResult) => string | undefined = () => undefined): string {
  const out: string[] = [];
  const cell = (s: string): string => s.replace(/\|/g, '\\|').replace(/\n/g, ' ');
  for (const r of reports) {
    out.push(`### exchange \`${r.exchange}\``, '');
    out.push(Object.entries(r.counts).map(([k, v]) => `${k}: ${v}`).join(' · ') + ` — ${(r.durationMs / 1000).toFixed(1)} s`, '');
    out.push('| case | IBTA rule | expected | verdict | observed |', '| --- | --- | --- | --- | --- |');
    for (const c of r.cases) {
      out.push(`| \`${c.id}\` | ${cell(c.rule)} | ${cell(c.expected)} | **${c.verdict}** | ${cell(c.observed)}${c.pcap ? ` (\`${c.pcap}\`)` : ''} |`);
    }
    out.push('');
    const notes = r.cases.filter((c) => c.verdict !== 'pass' && c.verdict !== 'not-applicable').map((c) => [c, explain(r, c)] as const).filter(([, e]) => e);
    if (notes.length) {
      out.push('Deviations explained:', '');
      for (const [c, e] of notes) out.push(`- \`${c.id}\`: ${e}`);
      out.push('');
    }
  }
  return out.join('\n');
}
