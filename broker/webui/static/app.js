// The broker's web UI: it reads the broker's /v1/gpu API and draws what it
// says; every decision is the broker's. The ACL token lives in this tab's
// session storage and travels only in the X-Nomad-Token header.
'use strict';

const TOKEN_KEY = 'nomad-gpu-token';
const ROW = 30; // px, as --row in app.css
const LETTER = { free: 'F', held: 'H', idle: 'I', unhealthy: 'U', recovering: 'R' };
const ui = { renders: 0, lastRenderMs: 0, nodes: 0, gpus: 0, mapIndex: 0 }; // read by the browser tests
window.nomadGPU = ui;

let map = null; // the last GPU map
let viewGen = 0; // bumped on every view change or new token: older loops end

const $ = (id) => document.getElementById(id);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c);
  return e;
}

function token() { return sessionStorage.getItem(TOKEN_KEY) || ''; }

// request answers { data, headers } (a list's index and paging are headers).
async function request(path, method) {
  const headers = {};
  if (token()) headers['X-Nomad-Token'] = token();
  const r = await fetch(path, { method: method || 'GET', headers, cache: 'no-store' });
  const text = await r.text();
  if (!r.ok) {
    const e = new Error(text.trim() || `${r.status} ${r.statusText}`);
    e.status = r.status;
    throw e;
  }
  return { data: text ? JSON.parse(text) : null, headers: r.headers };
}

async function api(path, method) { return (await request(path, method)).data; }

function setStatus(text, error) {
  const s = $('status');
  s.textContent = text;
  s.classList.toggle('error', !!error);
}

function failed(e) {
  if (e.status === 403) setStatus(`Forbidden: ${e.message}. Enter a Nomad ACL token above.`, true);
  else setStatus(`Cannot reach the broker: ${e.message}`, true);
}

function live(what) { setStatus(`live · ${what} · updated ${new Date().toLocaleTimeString()}`); }

// jobLink links a job to Nomad's UI, in its region when that is not the
// broker's own (a reclaim decision's region; the text then says it).
const jobLink = (ns, job, region) => el('a', { href: `/ui/jobs/${encodeURIComponent(job)}@${encodeURIComponent(ns || 'default')}` +
  (region ? `?region=${encodeURIComponent(region)}` : ''), text: region ? `${job} (${region})` : job });
// backoffText says what holds a queued job back from borrowing, as the CLI does.
const backoffText = (b) => (b.no_more
  ? `borrowing no more (preempted ${b.preemptions} times: borrowing.max_preemptions)`
  : `borrowing again after ${new Date(b.until).toLocaleTimeString()} (preempted ${b.preemptions} times)`);
const num = (v, digits) => (v === undefined || v === null ? '—' : Number(v).toFixed(digits === undefined ? 0 : digits));

function ago(t) {
  const s = Math.max(0, (Date.now() - new Date(t).getTime()) / 1000);
  return duration(s) + ' ago';
}

function duration(s) {
  s = Math.round(s);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

// ---- views ----

const views = { map: mapLoop, queues: queuesLoop, tenants: tenantsLoop, reclaim: reclaimLoop };

function show() {
  const name = (location.hash || '#map').slice(1);
  const view = views[name] ? name : 'map';
  for (const v of Object.keys(views)) $(`view-${v}`).hidden = v !== view;
  for (const a of document.querySelectorAll('nav a[data-view]')) {
    if (a.dataset.view === view) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  const gen = ++viewGen;
  views[view](gen);
}

// ---- GPU map ----

async function mapLoop(gen) {
  let index = 0;
  while (gen === viewGen) {
    try {
      const m = await api('/v1/gpu/nodes' + (index ? `?index=${index}&wait=10s` : ''));
      if (gen !== viewGen) return;
      map = m;
      index = m.index;
      renderMap();
      live(`Nomad index ${m.index}`);
    } catch (e) {
      if (gen !== viewGen) return;
      failed(e);
      await sleep(2000);
    }
  }
}

function cellState(g) { return g.state + (g.borrowed ? ' borrowed' : ''); }

function describe(node, g) {
  const lines = [`${g.id} (${g.model})`, `state: ${g.state}${g.borrowed ? ', borrowed' : ''}`];
  if (g.health) lines.push(`health: ${g.health}`);
  if (g.job) lines.push(`job: ${g.job} in ${g.namespace}`);
  if (g.tenant) lines.push(`tenant: ${g.tenant}, queue ${g.queue}`);
  if (g.utilization !== undefined) lines.push(`utilisation: ${num(g.utilization)}%`);
  if (g.memory_used_mib !== undefined) lines.push(`memory: ${num(g.memory_used_mib)} of ${num(g.memory_total_mib)} MiB`);
  if (g.temperature_c !== undefined) lines.push(`temperature: ${num(g.temperature_c)} °C`);
  if (g.power_w !== undefined) lines.push(`power: ${num(g.power_w)} W`);
  lines.push(`node: ${node.name}`);
  return lines.join('\n');
}

function filtered() {
  const pool = $('f-pool').value, model = $('f-model').value, tenant = $('f-tenant').value;
  const region = $('f-region').value;
  const name = $('f-node').value.trim().toLowerCase();
  const out = [];
  for (const n of map.nodes) {
    if (region && n.region !== region) continue;
    if (pool && n.node_pool !== pool) continue;
    if (name && !n.name.toLowerCase().includes(name)) continue;
    const gpus = model ? n.gpus.filter((g) => g.model === model) : n.gpus;
    if (!gpus.length) continue;
    if (tenant && !gpus.some((g) => g.tenant === tenant)) continue;
    out.push({ node: n, gpus });
  }
  return out;
}

function options(select, values) {
  const keep = select.value;
  const have = [...select.options].map((o) => o.value).slice(1).join('\n');
  const want = [...values].sort();
  if (have === want.join('\n')) return;
  select.replaceChildren(el('option', { value: '', text: 'all' }), ...want.map((v) => el('option', { value: v, text: v })));
  select.value = want.includes(keep) ? keep : '';
}

let rows = []; // the filtered rows the virtual list draws from

function renderMap() {
  if (!map) return;
  const t0 = performance.now();
  const pools = new Set(), models = new Set(), tenants = new Set(), regions = new Set();
  for (const n of map.nodes) {
    pools.add(n.node_pool);
    if (n.region) regions.add(n.region); // set when the broker governs several regions
    for (const g of n.gpus) {
      models.add(g.model);
      if (g.tenant) tenants.add(g.tenant);
    }
  }
  options($('f-region'), regions);
  $('f-region-label').hidden = regions.size < 2;
  options($('f-pool'), pools);
  options($('f-model'), models);
  options($('f-tenant'), tenants);
  rows = filtered();
  const counts = {};
  let total = 0;
  for (const r of rows) {
    for (const g of r.gpus) {
      const k = g.state + (g.borrowed ? ' (borrowed)' : '');
      counts[k] = (counts[k] || 0) + 1;
      total++;
    }
  }
  $('map-summary').textContent = `${rows.length} nodes, ${total} GPUs: ` +
    Object.keys(counts).sort().map((k) => `${counts[k]} ${k}`).join(', ') + `. Idle means below ${map.idle_below}% utilisation.`;
  $('map-spacer').style.height = `${rows.length * ROW}px`;
  drawRows();
  ui.renders++;
  ui.lastRenderMs = performance.now() - t0;
  ui.nodes = rows.length;
  ui.gpus = total;
  ui.mapIndex = map.index;
}

// drawRows puts in the DOM only the rows in sight (and a few around), so
// that a cluster of thousands of nodes scrolls as one of ten.
function drawRows() {
  const box = $('map-rows');
  const first = Math.max(0, Math.floor(box.scrollTop / ROW) - 5);
  const last = Math.min(rows.length, first + Math.ceil((box.clientHeight || 600) / ROW) + 10);
  const out = [$('map-spacer')];
  for (let i = first; i < last; i++) out.push(drawRow(rows[i], i));
  box.replaceChildren(...out);
}

function drawRow(r, i) {
  const n = r.node;
  const marks = [];
  if (n.status !== 'ready') marks.push(n.status);
  if (n.draining) marks.push('draining');
  if (!n.eligible) marks.push('ineligible');
  const cells = el('div', { class: 'cells' });
  for (const g of r.gpus) {
    const label = describe(n, g);
    const attrs = { class: `cell s-${cellState(g)}`, 'data-state': g.state, 'data-gpu': g.id, title: label, 'aria-label': label };
    if (g.borrowed) attrs['data-borrowed'] = 'true';
    if (g.tenant) attrs['data-tenant'] = g.tenant;
    let cell;
    if (g.job) {
      attrs.href = `/ui/jobs/${encodeURIComponent(g.job)}@${encodeURIComponent(g.namespace)}`;
      cell = el('a', attrs);
    } else {
      cell = el('span', attrs);
    }
    if (g.utilization !== undefined) {
      const u = el('span', { class: 'util' });
      u.style.width = `${Math.min(100, Math.max(0, g.utilization))}%`;
      cell.append(u);
    }
    cell.append(el('span', { class: 'l', text: g.borrowed ? 'B' : LETTER[g.state] || '?' }));
    cells.append(cell);
  }
  const row = el('div', { class: 'row', 'data-node': n.name, 'data-gpus': String(r.gpus.length) },
    el('a', { class: 'node', href: `/ui/clients/${encodeURIComponent(n.id)}` + (n.region ? `?region=${encodeURIComponent(n.region)}` : ''), text: n.name,
      title: `${n.name} · pool ${n.node_pool}` + (n.region ? ` · region ${n.region}` : '') }),
    el('span', { class: 'pool', text: n.node_pool }),
    el('span', { class: 'marks', text: marks.join(' · ') }),
    cells);
  row.style.top = `${i * ROW}px`;
  return row;
}

// ---- queues ----

// The first rows of the queue in admission order, as a blocking query on
// the queue's index: a long queue is neither fetched whole nor redrawn
// while it does not change ("Show more" asks for more rows).
let queueRows = 200;

async function queuesLoop(gen) {
  let index = 0;
  while (gen === viewGen) {
    try {
      const r = await request(`/v1/gpu/queue?per_page=${queueRows}` + (index ? `&index=${index}&wait=10s` : ''));
      if (gen !== viewGen) return;
      renderQueues(r.data, Number(r.headers.get('X-Nomad-Gpu-Queued')) || r.data.length, gen);
      // Read again when the queue changes, or after 10 s at most: the
      // estimates move with the cluster, not the queue's index.
      index = Number(r.headers.get('X-Nomad-Index')) || 0;
      if (!index) await sleep(2000); // a broker that cannot block polls
      live(`${r.headers.get('X-Nomad-Gpu-Queued') || r.data.length} queued`);
    } catch (e) {
      if (gen !== viewGen) return;
      failed(e);
      await sleep(2000);
    }
  }
}

function startText(e) {
  if (e.parked) return `parked: ${e.parked}`;
  if (!e.estimate) return 'unknown (ask the leader broker)';
  if (!e.estimate.at) return e.estimate.why || 'unknown';
  const s = (new Date(e.estimate.at).getTime() - Date.now()) / 1000;
  return (s <= 0 ? 'any moment' : `in ${duration(s)}`) + (e.estimate.why ? ` (${e.estimate.why})` : '');
}

function renderQueues(entries, total, gen) {
  // With several regions each entry says the region it names ("auto": the
  // broker chooses), and the tables may be filtered by it.
  const regions = new Set(entries.map((e) => e.region).filter((r) => r));
  options($('q-region'), regions);
  $('q-region-bar').hidden = regions.size === 0;
  const region = $('q-region').value;
  const byQueue = new Map();
  for (const e of entries) {
    if (region && e.region !== region) continue;
    if (!byQueue.has(e.queue)) byQueue.set(e.queue, []);
    byQueue.get(e.queue).push(e);
  }
  const summary = $('queue-summary');
  summary.textContent = total ? `${total} job${total > 1 ? 's' : ''} waiting, in admission order.` : 'No job is waiting.';
  if (total > entries.length) {
    summary.append(` The first ${entries.length} are shown (\`gpu-broker queue list\` lists all). `,
      el('button', { type: 'button', text: 'Show more', onclick: () => { queueRows += 200; if (gen === viewGen) show(); } }));
  }
  const out = [];
  for (const [name, list] of [...byQueue.entries()].sort()) {
    const body = el('tbody');
    for (const e of list) {
      body.append(el('tr', { 'data-job': e.job_id, 'data-id': e.id },
        el('td', { class: 'num', text: String(e.position) }),
        el('td', {}, jobLink(e.namespace, e.job_id)),
        el('td', { text: e.namespace }),
        ...(regions.size ? [el('td', { text: e.region || '' })] : []),
        el('td', { text: e.tenant }),
        el('td', { class: 'num', text: num(e.demand, e.demand % 1 ? 2 : 0) }),
        el('td', { title: new Date(e.submitted_at).toLocaleString(), text: ago(e.submitted_at) }),
        el('td', { text: (e.backoff && !/borrowing (again after|no more \()/.test(e.reason) ? backoffText(e.backoff) + '; ' : '') + e.reason }),
        el('td', { text: startText(e) }),
        el('td', {}, el('button', { type: 'button', class: 'danger', text: 'Cancel', onclick: () => act(`cancel ${e.job_id}`, `/v1/gpu/queue/${e.id}`, 'DELETE') }))));
    }
    out.push(el('h2', { text: `Queue ${name}` }), el('table', { 'data-queue': name },
      el('thead', {}, el('tr', {}, ...['#', 'Job', 'Namespace', ...(regions.size ? ['Region'] : []), 'Tenant', 'GPUs', 'Waiting since', 'Why it waits', 'Estimated start', ''].map((h) => el('th', { text: h })))),
      body));
  }
  $('queue-tables').replaceChildren(...out);
}

async function act(what, path, method) {
  if (!confirm(`${what}?`)) return;
  try {
    await api(path, method);
    setStatus(`${what}: done`);
    show();
  } catch (e) {
    setStatus(`${what}: ${e.message}`, true);
  }
}

// ---- tenants ----

function day(d) { return d.toISOString().slice(0, 10); }

function period(days) {
  const to = new Date(Date.now() + 86400000);
  $('p-to').value = day(to);
  $('p-from').value = day(new Date(to.getTime() - days * 86400000));
}

async function tenantsLoop(gen) {
  if (!$('p-from').value) period(7);
  let n = 0;
  while (gen === viewGen) {
    try {
      const usage = await api('/v1/gpu/usage');
      if (gen !== viewGen) return;
      renderTenants(usage);
      if (n++ % 6 === 0) await report();
      live(`${usage.length} tenants`);
    } catch (e) {
      if (gen !== viewGen) return;
      failed(e);
    }
    await sleep(5000);
  }
}

function renderTenants(usage) {
  const out = [], budgets = [];
  for (const t of usage) {
    const scale = Math.max(t.limit, t.guaranteed, t.used, 1);
    const pct = (v) => `${(100 * v) / scale}%`;
    const bar = el('div', { class: 'bar', role: 'img',
      'aria-label': `${t.tenant}: ${t.used} used (${t.borrowed} borrowed), ${t.guaranteed} guaranteed, limit ${t.limit}` });
    const used = el('span', { class: 'used' });
    used.style.width = pct(t.used - t.borrowed);
    const borrowed = el('span', { class: 'borrowed' });
    borrowed.style.left = pct(t.used - t.borrowed);
    borrowed.style.width = pct(t.borrowed);
    const g = el('span', { class: 'mark', title: `guaranteed ${t.guaranteed}` });
    g.style.left = pct(t.guaranteed);
    const l = el('span', { class: 'mark limit', title: `limit ${t.limit}` });
    l.style.left = `calc(${pct(t.limit)} - 3px)`;
    bar.append(used, borrowed, g, l);
    out.push(el('div', { class: 'tenant', 'data-tenant': t.tenant },
      el('div', { class: 'caption' }, el('strong', { text: t.tenant }),
        t.used > t.limit + 1e-9 ? el('span', { class: 'over', text: `over its limit by ${num(t.used - t.limit, 1)} GPUs` }) : '',
        el('span', { text: `used ${num(t.used, 1)} (borrowed ${num(t.borrowed, 1)}) · guaranteed ${num(t.guaranteed, 1)} (solid mark) · limit ${num(t.limit, 1)} (dashed mark) · queued ${num(t.queued, 1)} GPUs` })),
      bar));
    if (t.budget) budgets.push(burnDown(t.budget));
  }
  $('tenant-bars').replaceChildren(...(out.length ? out : [el('p', { class: 'empty', text: 'The policy has no tenants.' })]));
  $('budgets').replaceChildren(...(budgets.length ? budgets : [el('p', { class: 'empty', text: 'No tenant has a GPU-hour budget.' })]));
}

// burnDown draws what is left of a budget at the end of each day so far,
// against the straight line that would spend it exactly by the reset.
function burnDown(b) {
  const W = 480, H = 140, pad = 30;
  const days = Math.max(1, Math.round((new Date(b.resets) - new Date(b.began)) / 86400000));
  const x = (d) => pad + ((W - 2 * pad) * d) / days;
  const y = (v) => H - pad + ((2 * pad - H) * Math.max(0, v)) / Math.max(b.gpu_hours, 1e-9);
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('width', W);
  svg.setAttribute('height', H);
  svg.setAttribute('role', 'img');
  const left = b.gpu_hours - b.spent_gpu_hours;
  svg.setAttribute('aria-label', `${b.tenant}: ${num(left, 1)} of ${b.gpu_hours} GPU-hours left this ${b.period}`);
  const line = (pts, attrs) => {
    const p = document.createElementNS(ns, 'polyline');
    p.setAttribute('points', pts.map(([a, v]) => `${x(a)},${y(v)}`).join(' '));
    p.setAttribute('fill', 'none');
    for (const [k, v] of Object.entries(attrs)) p.setAttribute(k, v);
    svg.append(p);
  };
  line([[0, b.gpu_hours], [days, 0]], { stroke: '#5a5a5a', 'stroke-dasharray': '5 4' });
  let remaining = b.gpu_hours;
  const pts = [[0, remaining]];
  (b.daily_gpu_hours || []).forEach((h, i) => { remaining -= h; pts.push([i + 1, remaining]); });
  line(pts, { stroke: '#0072b2', 'stroke-width': 3 });
  const text = (tx, ty, s, anchor) => {
    const t = document.createElementNS(ns, 'text');
    t.setAttribute('x', tx);
    t.setAttribute('y', ty);
    t.setAttribute('font-size', '11');
    t.setAttribute('text-anchor', anchor || 'start');
    t.textContent = s;
    svg.append(t);
  };
  text(pad, 14, `${b.gpu_hours} GPU-h`);
  text(pad, H - 8, new Date(b.began).toISOString().slice(0, 10));
  text(W - pad, H - 8, `resets ${new Date(b.resets).toISOString().slice(0, 10)}`, 'end');
  const over = b.spent_gpu_hours >= b.gpu_hours;
  return el('div', { class: 'budget', 'data-tenant': b.tenant },
    el('p', { class: over ? 'over' : '', text: `${b.tenant}: spent ${num(b.spent_gpu_hours, 1)} of ${b.gpu_hours} GPU-hours this ${b.period}` +
      (over ? ' — over budget: its jobs wait' : `, ${num(left, 1)} left`) + ' (solid: left at each day\'s end; dashed: even spending)' }),
    svg);
}

let reportRegions = null; // the regions the broker governs, read once

async function report() {
  const from = $('p-from').value, to = $('p-to').value, region = $('p-region').value;
  const body = $('report').tBodies[0];
  try {
    if (!reportRegions) {
      reportRegions = await api('/v1/gpu/regions').then((rs) => rs.map((r) => r.name), () => []); // none: no filter
      options($('p-region'), reportRegions);
      $('p-region-label').hidden = reportRegions.length < 2;
    }
    const rep = await api(`/v1/gpu/usage?from=${encodeURIComponent(from)}&to=${encodeURIComponent(to)}&by=tenant&region=${encodeURIComponent(region)}`);
    const rows = rep.rows || [];
    body.replaceChildren(...(rows.length ? rows.map((r) => el('tr', { 'data-tenant': r.group },
      el('td', { text: r.group || '(not admitted by the broker)' }),
      el('td', { class: 'num', text: num(r.allocated_gpu_hours, 2) }),
      el('td', { class: 'num', text: num(r.busy_gpu_hours, 2) }),
      el('td', { class: 'num', text: num(r.idle_gpu_hours, 2) }),
      el('td', { class: 'num', text: `${num(100 * r.idle_share, 1)}%` }),
      el('td', { class: 'num', text: `${num(r.cost, 2)} ${rep.currency}` }),
      el('td', { class: r.over_limit_gpu_seconds > 0 ? 'num over' : 'num', text: num(r.over_limit_gpu_seconds || 0, 0) }))) :
      [el('tr', {}, el('td', { colspan: '7', class: 'empty', text: `No GPU-hours from ${rep.from} to ${rep.to}.` }))]));
  } catch (e) {
    body.replaceChildren(el('tr', {}, el('td', { colspan: '7', class: 'empty', text: e.message })));
  }
}

// ---- reclaim and approvals ----

async function reclaimLoop(gen) {
  while (gen === viewGen) {
    try {
      const recs = await api('/v1/gpu/reclaim');
      let approvals = [];
      try {
        approvals = await api('/v1/gpu/approvals');
      } catch (e) {
        if (e.status !== 404) throw e; // 404: this broker keeps no approvals
      }
      let aside = null; // null: not the caller's to read (operators only)
      try {
        aside = await api('/v1/gpu/quarantine');
      } catch (e) {
        if (e.status !== 403 && e.status !== 404) throw e;
      }
      if (gen !== viewGen) return;
      renderReclaim(recs, approvals);
      renderAside(aside);
      live(`${recs.length} decisions, ${approvals.length} approvals`);
    } catch (e) {
      if (gen !== viewGen) return;
      failed(e);
    }
    await sleep(3000);
  }
}

function renderReclaim(recs, approvals) {
  const proposed = recs.filter((r) => r.state === 'proposed');
  const decided = recs.filter((r) => r.state !== 'proposed').slice(0, 100);
  const empty = (n, text) => [el('tr', {}, el('td', { colspan: String(n), class: 'empty', text }))];
  $('proposed').tBodies[0].replaceChildren(...(proposed.length ? proposed.map((r) => el('tr', { 'data-id': r.id, 'data-job': r.job },
    el('td', {}, jobLink(r.namespace, r.job, r.region)),
    el('td', { text: r.tenant || '—' }),
    el('td', { text: r.rule }),
    el('td', { text: r.action }),
    el('td', { class: 'num', text: String(r.gpus) }),
    el('td', { class: 'countdown', 'data-act-after': r.act_after, text: countdown(r) }),
    el('td', { text: r.evidence }),
    el('td', {}, r.acting_since ? 'being carried out' : el('button', { type: 'button', class: 'danger', text: 'Cancel',
      onclick: () => act(`cancel the ${r.rule} decision on ${r.job}`, `/v1/gpu/reclaim/${r.id}`, 'DELETE') })))) :
    empty(8, 'No decision is waiting out its grace.')));
  const pending = approvals.filter((a) => a.state === 'pending');
  $('approvals').tBodies[0].replaceChildren(...(pending.length ? pending.map((a) => el('tr', { 'data-id': a.id, 'data-job': a.job },
    el('td', {}, jobLink(a.namespace, a.job)),
    el('td', { text: a.priority ? `priority ${a.priority}` : `${a.extra_gpus} GPUs above the limit` }),
    el('td', { text: a.for }),
    el('td', { text: a.reason }),
    el('td', { text: `${a.requested_by}, ${ago(a.requested_at)}` }),
    el('td', {},
      el('button', { type: 'button', text: 'Grant', onclick: () => act(`grant ${a.job}'s request`, `/v1/gpu/approvals/${a.id}/grant`, 'POST') }), ' ',
      el('button', { type: 'button', class: 'danger', text: 'Deny', onclick: () => act(`deny ${a.job}'s request`, `/v1/gpu/approvals/${a.id}/deny`, 'POST') })))) :
    empty(6, 'No request waits for an approver.')));
  $('decided').tBodies[0].replaceChildren(...(decided.length ? decided.map((r) => el('tr', { 'data-id': r.id, 'data-job': r.job },
    el('td', {}, jobLink(r.namespace, r.job, r.region)),
    el('td', { text: r.rule }),
    el('td', { text: r.action }),
    el('td', { text: r.state }),
    el('td', { text: ago(r.executed_at || r.proposed_at) }),
    el('td', { text: r.result || r.evidence }))) :
    empty(6, 'Nothing decided yet.')));
}

// renderAside lists the records of Consul KV set aside as unreadable: each
// stopped nothing, but someone should look at it (and delete it).
function renderAside(aside) {
  $('aside-section').hidden = aside === null;
  if (aside === null) return;
  $('aside').tBodies[0].replaceChildren(...(aside.length ? aside.map((a) => el('tr', {},
    el('td', { text: a.key }),
    el('td', { class: 'num', text: String(a.bytes) }))) :
    [el('tr', {}, el('td', { colspan: '2', class: 'empty', text: 'No record was set aside.' }))]));
}

// policyLoop keeps the banner saying when the policy in force is stale: its
// files changed, and the broker refused to load them.
async function policyLoop() {
  for (;;) {
    try {
      const st = await api('/v1/gpu/policy');
      $('policy-banner').hidden = !st.stale;
      if (st.stale) {
        $('policy-banner').textContent = `The policy in force is stale: the broker refused to reload its files ` +
          `(${ago(st.last_reload_at)}) and keeps the policy it loaded ${ago(st.loaded_at)}. ${st.last_error}`;
      }
    } catch (e) {
      // Another view reports the broker being unreachable or the token refused.
    }
    await sleep(10000);
  }
}

function countdown(r) {
  const s = (new Date(r.act_after).getTime() - Date.now()) / 1000;
  return s > 0 ? duration(s) : 'due';
}

setInterval(() => {
  for (const td of document.querySelectorAll('td.countdown')) td.textContent = countdown({ act_after: td.dataset.actAfter });
}, 1000);

// ---- wiring ----

$('token-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const t = $('token').value.trim();
  if (t) sessionStorage.setItem(TOKEN_KEY, t);
  $('token').value = '';
  $('token').placeholder = t ? 'token set for this tab' : $('token').placeholder;
  show();
});
$('forget').addEventListener('click', () => {
  sessionStorage.removeItem(TOKEN_KEY);
  $('token').placeholder = 'Nomad ACL token (kept in this tab only)';
  show();
});
if (token()) $('token').placeholder = 'token set for this tab';
$('q-region').addEventListener('input', () => show());
for (const id of ['f-region', 'f-pool', 'f-model', 'f-tenant', 'f-node']) $(id).addEventListener('input', () => { $('map-rows').scrollTop = 0; renderMap(); });
$('map-rows').addEventListener('scroll', () => requestAnimationFrame(drawRows));
$('p-7').addEventListener('click', () => { period(7); report(); });
$('p-30').addEventListener('click', () => { period(30); report(); });
for (const id of ['p-from', 'p-to', 'p-region']) $(id).addEventListener('change', report);
window.addEventListener('hashchange', show);
show();
policyLoop();
