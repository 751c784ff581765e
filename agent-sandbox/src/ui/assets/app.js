// app.js: the browser side of `agent-sandbox ui`. One page, vanilla JS, no build step, loaded
// with `defer` under a strict CSP. It polls the local server's JSON API and shows the list of
// sandboxes (#/) or one sandbox (#/s/NAME): its connections, pending names, policy and screen.
//
// Security: every string from the server (sandbox names, domains, reasons, screen text) is
// chosen by the agent and may be hostile markup, so it reaches the DOM only through
// textContent / createTextNode / setAttribute, never innerHTML.
'use strict';

(() => {
  const POLL_MS = 1000;
  // The agent can tell when the page looks (it reads the agent's screen) and add a name just
  // before a click: Approve is enabled only once the list has held still this long.
  const SETTLE_MS = 1500;
  // More names than this (`allow --pending` wants `--yes N` past it), or one under a new site or
  // a forwarded service's site, and Approve first lists every name in a dialog, with why.
  const APPROVE_WITHOUT_CONFIRM = 3;
  // A request that does not answer in this long is given up, so a poll never sticks.
  const REQUEST_MS = 15000;
  const CONN_LIMIT = 500;
  const DASH = '—';
  const TOKEN_REFUSED = 'the token was refused — open the URL agent-sandbox ui printed';
  const UNREACHABLE = 'cannot reach the agent-sandbox ui server — is it still running?';
  const TOKEN = (document.querySelector('meta[name="agent-sandbox-token"]') || {}).content || '';

  const $ = (id) => document.getElementById(id);

  const state = {
    route: { view: null, name: null },
    sandboxes: null,     // the last list answer, null until the first one
    seq: 0,              // bumped on every route change: answers for an older view are dropped
    sigs: {},            // per table: the signature of what it shows now
    shownPending: [],    // the names #pending shows right now: exactly what Approve posts
    cautions: {},        // name -> why approving it needs the dialog (a new site, a forwarded service's)
    pendingSince: 0,     // when the shown names last changed (Approve waits SETTLE_MS after)
    confirming: [],      // the names the approval dialog lists: exactly what its Approve posts
    acting: false,       // approve/dismiss in flight
    denying: new Set(),  // runtime entries whose deny is in flight
    stopTarget: null,
    busy: {},            // poll key -> request in flight
    again: {},           // poll key -> a forced refresh waits for the request in flight
    failing: new Set(),  // poll keys whose last request failed
    messageFromPoll: false,
    lastOk: 0,
    tick: 0,
  };

  // ---------------------------------------------------------------- formatting

  function fmtUptime(s) {
    if (typeof s !== 'number' || !isFinite(s) || s < 0) return DASH;
    s = Math.floor(s);
    const d = Math.floor(s / 86400), h = Math.floor(s / 3600) % 24;
    const m = Math.floor(s / 60) % 60, sec = s % 60;
    if (d) return `${d}d ${h}h`;
    if (h) return `${h}h ${m}m`;
    if (m) return `${m}m ${sec}s`;
    return `${sec}s`;
  }

  function fmtBytes(n, empty = '') {
    if (typeof n !== 'number' || !isFinite(n)) return empty;
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    if (i === 0) return `${n} B`;
    return `${n < 10 ? n.toFixed(1).replace(/\.0$/, '') : Math.round(n)} ${units[i]}`;
  }

  const fmtMs = (ms) => (typeof ms === 'number' && isFinite(ms) ? String(Math.round(ms)) : '');
  const fmtCount = (n) => (typeof n === 'number' ? String(n) : DASH);
  const pad = (n) => String(n).padStart(2, '0');
  const clock = (d) => `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  const MONTHS = 'Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec'.split(' ');

  // Log times are ISO strings in UTC; shown in local time, with the date only when not today.
  function fmtTime(value) {
    if (value == null || value === '') return '';
    const d = new Date(value);
    if (isNaN(d.getTime())) return String(value);
    const sameDay = d.toDateString() === new Date().toDateString();
    return sameDay ? clock(d) : `${MONTHS[d.getMonth()]} ${d.getDate()} ${clock(d)}`;
  }

  function shortId(id) {
    return typeof id === 'string' ? id.replace(/^sha256:/, '').slice(0, 12) : '';
  }

  function fmtLimits(l = {}) {
    const parts = [fmtBytes(l.memory_bytes), l.cpus != null ? `${l.cpus} cpu` : '', l.pids != null ? `${l.pids} pids` : ''];
    return parts.filter(Boolean).join(' · ') || 'none';
  }

  const arr = (v) => (Array.isArray(v) ? v : []);
  const str = (v) => (v == null ? '' : String(v));

  // ---------------------------------------------------------------- DOM helpers

  // Text always goes in through textContent, so hostile strings stay text.
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  }

  function cell(tr, text, cls, title) {
    const td = el('td', cls, text);
    if (title) td.setAttribute('title', title);
    tr.appendChild(td);
    return td;
  }

  // Swap a tbody's rows in one go, keeping its scroll box where the user left it.
  function replaceRows(tbody, frag) {
    const box = tbody.closest('.scroll');
    const top = box ? box.scrollTop : 0;
    tbody.replaceChildren(frag);
    if (box) box.scrollTop = top;
  }

  function emptyRow(colspan, text) {
    const tr = el('tr', 'empty');
    cell(tr, text).colSpan = colspan;
    return tr;
  }

  // Fill a <ul> with one item per entry, or a placeholder item when there is none.
  function fillList(ul, entries, item, emptyText) {
    const frag = document.createDocumentFragment();
    for (const entry of entries) frag.appendChild(item(entry));
    if (!entries.length) frag.appendChild(el('li', 'empty', emptyText));
    ul.replaceChildren(frag);
  }

  // True when `sig` differs from what `key` shows, remembering it; a cheap skip for polls
  // whose answer did not change (the raw response text is the signature).
  function changed(key, sig) {
    if (state.sigs[key] === sig) return false;
    state.sigs[key] = sig;
    return true;
  }

  function say(text, { error = false, fromPoll = false } = {}) {
    const m = $('message');
    m.textContent = text;
    m.classList.toggle('error', error && text !== '');
    state.messageFromPoll = fromPoll;
  }

  function setLive(kind, title) {
    const live = $('live');
    live.className = `live ${kind}`;
    live.setAttribute('title', title);
  }

  // ---------------------------------------------------------------- API

  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  async function api(method, path, body) {
    const init = { method, cache: 'no-store', headers: { 'X-Agent-Sandbox-Token': TOKEN } };
    if (method === 'POST') {
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body || {});
    }
    let res, text;
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), REQUEST_MS);
    init.signal = abort.signal;
    try {
      res = await fetch(path, init);
      text = await res.text();
    } catch (_) {
      throw new ApiError(0, UNREACHABLE);
    } finally {
      clearTimeout(timer);
    }
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (_) { /* not JSON: handled below */ }
    if (res.status === 401 || res.status === 403) throw new ApiError(res.status, TOKEN_REFUSED);
    if (!res.ok) {
      const msg = data && typeof data.error === 'string' ? data.error : `${res.status} ${res.statusText}`;
      throw new ApiError(res.status, msg);
    }
    if (data === null || typeof data !== 'object') throw new ApiError(res.status, 'the server answered something that is not JSON');
    return { data, text };
  }

  const sbPath = (name, tail) => `/api/sandboxes/${encodeURIComponent(name)}/${tail}`;

  // GET one of the open sandbox's resources and hand it to `draw`, unless the view changed
  // meanwhile or the answer is the one already drawn (the raw text is the signature).
  async function pollView(key, tail, seq, draw) {
    if (state.route.view !== 'sandbox') return;
    const { data, text } = await api('GET', sbPath(state.route.name, tail));
    if (seq === state.seq && changed(key, text)) draw(data);
  }

  // ---------------------------------------------------------------- polling

  const POLLERS = { list: pollList, connections: pollConnections, pending: pollPending, policy: pollPolicy, screen: pollScreen };
  const VIEW_KEYS = ['connections', 'pending', 'policy', 'screen'];

  // One request per key at a time: a regular tick is skipped while one is in flight; a forced
  // refresh (after an action or a new search) runs as soon as the one in flight ends.
  function poll(key, force = false) {
    if (state.busy[key]) {
      if (force) state.again[key] = true;
      return;
    }
    state.busy[key] = true;
    const seq = state.seq;
    POLLERS[key](seq)
      .then(() => pollOk(key))
      .catch((err) => pollFailed(key, err, seq))
      .finally(() => {
        state.busy[key] = false;
        if (state.again[key]) {
          state.again[key] = false;
          poll(key);
        }
      });
  }

  function pollOk(key) {
    state.failing.delete(key);
    state.lastOk = Date.now();
    $('updated').textContent = `updated ${clock(new Date())}`;
    if (state.failing.size === 0) {
      setLive('ok', 'answers arrive every second');
      if (state.messageFromPoll) say('');
    }
  }

  function pollFailed(key, err, seq) {
    if (key !== 'list' && seq !== state.seq) return;
    // A sandbox's own 404 is left to the list, which says "NAME is gone" once it is.
    if (key !== 'list' && err.status === 404) return;
    state.failing.add(key);
    setLive('down', err.message);
    const text = err.status === 0 || err.status === 401 || err.status === 403 ? err.message : `${key}: ${err.message}`;
    say(text, { error: true, fromPoll: true });
  }

  function tick() {
    state.tick++;
    poll('list');
    if (ownRunning()) {
      for (const key of VIEW_KEYS) if (key !== 'policy' || state.tick % 2 === 0) poll(key);
    } else {
      forgetViewFailures();
    }
    if (state.lastOk && state.failing.size === 0 && Date.now() - state.lastOk > 3 * POLL_MS) {
      setLive('stale', 'no answer for a few seconds');
    }
  }

  // On a sandbox view, unless the list says it is not running (its resources then answer 404).
  function ownRunning() {
    if (state.route.view !== 'sandbox') return false;
    const sb = arr(state.sandboxes).find((s) => s.name === state.route.name);
    return !sb || sb.running !== false;
  }

  function refreshView() {
    if (ownRunning()) for (const key of VIEW_KEYS) poll(key, true);
  }

  // A view's failures no longer count once it is not polled (left, or its sandbox stopped).
  function forgetViewFailures() {
    for (const key of VIEW_KEYS) state.failing.delete(key);
  }

  // ---------------------------------------------------------------- routing

  function parseRoute() {
    const m = /^#\/s\/(.+)$/.exec(location.hash);
    if (!m) return { view: 'list', name: null };
    try {
      return { view: 'sandbox', name: decodeURIComponent(m[1]) };
    } catch (_) {
      return { view: 'list', name: null };
    }
  }

  function go(hash) {
    if (location.hash !== hash) location.hash = hash;
    route(); // right away, not on hashchange: a poll answer must not see the old view
  }

  function route() {
    const next = parseRoute();
    const cur = state.route;
    if (next.view === cur.view && next.name === cur.name) return;
    state.route = next;
    state.seq++;
    forgetViewFailures();
    $('list').hidden = next.view !== 'list';
    $('sandbox').hidden = next.view !== 'sandbox';
    if (next.view === 'sandbox') {
      openSandbox(next.name, cur.name);
    } else {
      document.title = 'agent-sandbox';
      closeStopDialog();
    }
  }

  function openSandbox(name, previous) {
    $('sandbox').setAttribute('data-name', name);
    document.title = `${name} · agent-sandbox`;
    state.sigs = { list: state.sigs.list }; // everything of the view is drawn afresh
    if (name !== previous) {
      for (const id of ['conn-search', 'conn-verdict', 'allow-input']) $(id).value = '';
    }
    for (const id of ['totals', 'connections']) $(id).tBodies[0].replaceChildren();
    for (const id of ['pending', 'budgets', 'policy', 'runtime', 'conn-count', 'conn-limit', 'unallowable',
      'screen', 'sb-agent', 'sb-project', 'sb-state', 'sb-uptime', 'sb-shape', 'sb-image', 'sb-limits']) {
      $(id).replaceChildren();
    }
    $('sb-note').hidden = true;
    state.shownPending = [];
    state.denying.clear();
    updatePendingButtons();
    renderHeader();
    if (!checkGone()) refreshView();
  }

  // The open sandbox left the list: say so and go back to it. True if it did.
  function checkGone() {
    const { view, name } = state.route;
    if (view !== 'sandbox' || !state.sandboxes) return false;
    if (state.sandboxes.some((s) => s.name === name)) return false;
    go('#/');
    say(`${name} is gone`);
    return true;
  }

  // ---------------------------------------------------------------- list

  async function pollList() {
    const { data, text } = await api('GET', '/api/sandboxes');
    state.sandboxes = arr(data.sandboxes);
    if (changed('list', text)) renderList(state.sandboxes);
    renderHeader();
    checkGone();
  }

  function renderList(list) {
    const running = list.filter((s) => s.running).length;
    $('list-summary').textContent = list.length ? `${list.length} sandboxes, ${running} running` : '';
    $('no-sandboxes').hidden = list.length > 0;
    $('sandboxes').closest('.panel').hidden = list.length === 0;
    const frag = document.createDocumentFragment();
    for (const sb of list) frag.appendChild(sandboxRow(sb));
    replaceRows($('sandboxes').tBodies[0], frag);
  }

  function sandboxRow(sb) {
    const tr = el('tr', sb.running ? 'sandbox' : 'sandbox stopped');
    tr.setAttribute('data-name', str(sb.name));
    cell(tr, str(sb.agent), 'mono', str(sb.agent));
    cell(tr, null, 'mono path', str(sb.project)).appendChild(el('span', null, str(sb.project)));
    cell(tr, fmtUptime(sb.uptime_s), 'num');
    cell(tr, str(sb.state), sb.running ? 'state up' : 'state down');
    const image = el('span', null, str(sb.image));
    if (sb.image_id) image.appendChild(el('span', 'id', ` ${shortId(sb.image_id)}`));
    cell(tr, null, 'mono image', `${str(sb.image)} ${str(sb.image_id)}`).appendChild(image);
    cell(tr, fmtLimits(sb.limits));
    cell(tr, fmtCount(sb.allowed), 'num');
    cell(tr, fmtCount(sb.refused), sb.refused > 0 ? 'num bad' : 'num');
    const link = el('a', 'open mono', str(sb.name));
    link.setAttribute('href', `#/s/${encodeURIComponent(str(sb.name))}`);
    cell(tr, null).appendChild(link);
    return tr;
  }

  // ---------------------------------------------------------------- sandbox header

  function renderHeader() {
    if (state.route.view !== 'sandbox') return;
    $('sb-name').textContent = state.route.name;
    const sb = arr(state.sandboxes).find((s) => s.name === state.route.name);
    if (!sb || !changed('header', JSON.stringify(sb))) return;
    $('sb-agent').textContent = str(sb.agent);
    $('sb-project').textContent = str(sb.project);
    $('sb-state').textContent = str(sb.state);
    $('sb-state').className = sb.running ? 'state up' : 'state down';
    $('sb-uptime').textContent = fmtUptime(sb.uptime_s);
    $('sb-shape').textContent = str(sb.shape);
    $('sb-image').textContent = sb.image_id ? `${str(sb.image)} (${shortId(sb.image_id)})` : str(sb.image);
    $('sb-image').setAttribute('title', str(sb.image_id));
    $('sb-limits').textContent = fmtLimits(sb.limits);
    $('sb-note').hidden = sb.running !== false;
    $('sb-note').textContent = sb.running === false
      ? `${str(sb.name)} is not running (${str(sb.state)}): its connections, queue, policy and screen are not read`
      : '';
  }

  // ---------------------------------------------------------------- connections

  function connQuery() {
    const params = new URLSearchParams();
    const q = $('conn-search').value.trim();
    const verdict = $('conn-verdict').value;
    if (q) params.set('q', q);
    if (verdict) params.set('verdict', verdict);
    params.set('limit', String(CONN_LIMIT));
    return params.toString();
  }

  function pollConnections(seq) {
    const query = connQuery();
    // An answer to an older search is dropped: the forced refresh of the new one follows.
    return pollView('conn', `connections?${query}`, seq, (data) => {
      if (query === connQuery()) renderConnections(data);
      else delete state.sigs.conn;
    });
  }

  function renderConnections(data) {
    const lines = arr(data.lines), totals = arr(data.totals);
    $('conn-count').textContent = `${fmtCount(data.matched)} of ${fmtCount(data.lines_total)} lines`;
    $('conn-limit').textContent = data.matched > lines.length ? `(newest ${lines.length} shown)` : '';
    if (changed('totals', JSON.stringify(totals))) renderTotals(totals);
    if (changed('connections', JSON.stringify(lines))) renderLines(lines);
  }

  function renderTotals(totals) {
    const frag = document.createDocumentFragment();
    for (const t of totals) {
      const tr = el('tr', 'total');
      tr.setAttribute('data-name', str(t.name));
      cell(tr, str(t.name), 'mono');
      cell(tr, fmtCount(t.allowed), 'num');
      cell(tr, fmtCount(t.refused), t.refused > 0 ? 'num bad' : 'num');
      cell(tr, fmtBytes(t.bytes_up), 'num');
      cell(tr, fmtBytes(t.bytes_down), 'num');
      frag.appendChild(tr);
    }
    if (!totals.length) frag.appendChild(emptyRow(5, 'no lines match'));
    replaceRows($('totals').tBodies[0], frag);
  }

  function renderLines(lines) {
    const frag = document.createDocumentFragment();
    for (const line of lines) frag.appendChild(lineRow(line));
    if (!lines.length) frag.appendChild(emptyRow(9, 'no lines match'));
    replaceRows($('connections').tBodies[0], frag);
  }

  function lineRow(line) {
    const refused = line.verdict === 'refused';
    const tr = el('tr', refused ? 'connection refused' : 'connection');
    cell(tr, fmtTime(line.time), 'time', str(line.time));
    const who = line.name ? str(line.name) : str(line.address);
    cell(tr, who, 'mono who', line.name ? str(line.address) : '');
    cell(tr, str(line.port), 'num', str(line.protocol));
    cell(tr, null).appendChild(el('span', `verdict ${refused ? 'refused' : 'allowed'}`, str(line.verdict)));
    cell(tr, str(line.reason), 'reason', str(line.reason));
    cell(tr, fmtBytes(line.bytes_up), 'num');
    cell(tr, fmtBytes(line.bytes_down), 'num');
    cell(tr, fmtMs(line.ms), 'num');
    cell(tr, line.repeats > 0 ? `+${line.repeats}` : '', 'num muted',
      line.repeats > 0 ? `${line.repeats} more lines like it, folded into this one` : '');
    return tr;
  }

  // ---------------------------------------------------------------- pending

  function pollPending(seq) { return pollView('pending', 'pending', seq, renderPending); }

  function renderPending(data) {
    // Upload budgets are never approved by the button, wherever the server put them.
    const all = arr(data.names).concat(arr(data.budgets));
    const names = all.filter((p) => p.kind !== 'upload');
    const budgets = all.filter((p) => p.kind === 'upload');
    fillList($('pending'), names, (p) => pendingItem(p, 'pending'), 'nothing waiting for approval');
    fillList($('budgets'), budgets, (p) => pendingItem(p, 'budget'), 'none');
    const shown = names.map((p) => str(p.name));
    if (shown.join('\n') !== state.shownPending.join('\n')) {
      state.pendingSince = Date.now();
      setTimeout(updatePendingButtons, SETTLE_MS + 50);
    }
    state.shownPending = shown;
    state.cautions = Object.fromEntries(names.filter((p) => p.caution).map((p) => [str(p.name), str(p.caution)]));

    const unallowable = arr(data.unallowable).map(str);
    const inward = arr(data.addresses).map((p) => `${str(p.name)} (${arr(p.addresses).map(str).join(', ')})`);
    $('unallowable').textContent = [
      unallowable.length ? `refused, and not domains a policy can hold (never approvable): ${unallowable.join(', ')}` : '',
      inward.length ? `answered into your network or a metadata service, which no approval opens: ${inward.join('; ')}` : '',
    ].filter((t) => t).join(' — ');
    updatePendingButtons();
  }

  function pendingItem(p, cls) {
    const li = el('li', cls);
    li.setAttribute('data-name', str(p.name));
    li.appendChild(el('span', 'item-name mono', str(p.name)));
    if (p.caution) {
      const tag = el('span', 'tag', p.new_site ? 'new site' : 'forwarded site');
      tag.setAttribute('title', str(p.caution));
      li.appendChild(tag);
    }
    li.appendChild(el('span', 'count', `×${fmtCount(p.count)}`));
    if (p.upload && typeof p.upload === 'object') {
      li.appendChild(el('span', 'muted', `sent ${fmtBytes(p.upload.sent, '?')} of ${fmtBytes(p.upload.budget, '?')}/h`));
    }
    const when = el('span', 'when', `${fmtTime(p.first)} – ${fmtTime(p.last)}`);
    when.setAttribute('title', `first ${str(p.first)}, last ${str(p.last)}`);
    li.appendChild(when);
    return li;
  }

  function updatePendingButtons() {
    const n = state.shownPending.length;
    const approve = $('approve'), dismiss = $('dismiss');
    approve.textContent = n ? `Approve these ${n}` : 'Approve';
    dismiss.textContent = n ? `Dismiss these ${n}` : 'Dismiss';
    const settling = Date.now() - state.pendingSince < SETTLE_MS;
    approve.disabled = n === 0 || state.acting || settling;
    dismiss.disabled = n === 0 || state.acting;
    approve.title = settling ? 'the list just changed: look at it first' : '';
  }

  // Approve: at once for a few names of sites the policy knows; otherwise every name is listed
  // in a dialog first (the page's `--yes N`), and its Approve posts exactly that list.
  function askApprove() {
    const names = state.shownPending.slice();
    if (!names.length || state.acting) return;
    if (names.length <= APPROVE_WITHOUT_CONFIRM && !names.some((n) => state.cautions[n])) {
      actOnPending('approve', names);
      return;
    }
    state.confirming = names;
    const list = $('confirm-approve-list');
    list.replaceChildren(...names.map((n) => {
      const li = el('li', 'mono', n);
      const item = $('pending').querySelector(`li.pending[data-name="${CSS.escape(n)}"]`);
      const tag = item && item.querySelector('.tag');
      if (tag) li.appendChild(el('span', 'tag', tag.textContent));
      if (state.cautions[n]) li.appendChild(el('div', 'why', state.cautions[n]));
      return li;
    }));
    $('confirm-approve-text').textContent =
      `Allow these ${names.length} names in ${state.route.name}? The agent reaches them at once.`;
    $('confirm-approve').showModal();
    $('confirm-approve-no').focus();
  }

  function closeApproveDialog() {
    const dialog = $('confirm-approve');
    if (dialog.open) dialog.close();
  }

  // Approve or dismiss exactly the names the page shows; a 409 means the queue moved on.
  // `confirmed`: from the dialog, the one way the server approves a name needing a second look.
  async function actOnPending(action, names = state.shownPending.slice(), confirmed = false) {
    const name = state.route.name;
    if (!names.length || state.acting) return;
    state.acting = true;
    updatePendingButtons();
    try {
      const { data } = await api('POST', sbPath(name, action), action === 'approve' ? { names, confirmed } : { names });
      if (action === 'approve') say(`approved ${arr(data.approved).join(', ') || names.join(', ')}`);
      else say(`dismissed ${typeof data.dismissed === 'number' ? data.dismissed : names.length} pending`);
    } catch (err) {
      const text = err.status === 409
        ? `${err.message} — the pending list changed and was refreshed: look at it again`
        : `${action}: ${err.message}`;
      say(text, { error: true });
    } finally {
      state.acting = false;
      delete state.sigs.pending; // redraw even if the answer looks the same
      updatePendingButtons();
      refreshView();
    }
  }

  // ---------------------------------------------------------------- policy

  function pollPolicy(seq) { return pollView('policy', 'policy', seq, renderPolicy); }

  // "x.test upload=1000" -> "x.test": deny takes the name alone.
  const entryName = (entry) => str(entry).trim().split(/\s+/)[0];

  function renderPolicy(data) {
    const inForce = arr(data.in_force), runtime = arr(data.runtime);
    fillList($('policy'), inForce, (entry) => el('li', 'domain mono', str(entry)), 'no domains: nothing is reachable');
    fillList($('runtime'), runtime, runtimeItem, 'nothing added with allow');
  }

  function runtimeItem(entry) {
    const name = entryName(entry);
    const li = el('li', 'runtime');
    li.setAttribute('data-name', name);
    li.appendChild(el('span', 'item-name mono', str(entry)));
    const deny = el('button', 'deny', 'deny');
    deny.type = 'button';
    deny.setAttribute('title', `deny ${name}`);
    deny.disabled = state.denying.has(name);
    li.appendChild(deny);
    return li;
  }

  function setDenyDisabled(name, disabled) {
    for (const li of $('runtime').querySelectorAll('li.runtime')) {
      if (li.getAttribute('data-name') === name) li.querySelector('button.deny').disabled = disabled;
    }
  }

  async function denyEntry(domain) {
    if (state.denying.has(domain)) return;
    state.denying.add(domain);
    setDenyDisabled(domain, true);
    try {
      const { data } = await api('POST', sbPath(state.route.name, 'deny'), { domains: [domain] });
      say(`denied ${arr(data.denied).join(', ') || domain}`);
    } catch (err) {
      say(`deny: ${err.message}`, { error: true });
    } finally {
      state.denying.delete(domain);
      setDenyDisabled(domain, false);
      poll('policy', true);
    }
  }

  async function allowTyped() {
    const button = $('allow-button');
    if (button.disabled) return;
    const domains = $('allow-input').value.split(/[\s,]+/).filter(Boolean);
    if (!domains.length) {
      say('type one or more names to allow, separated by spaces or commas', { error: true });
      return;
    }
    button.disabled = true;
    try {
      const { data } = await api('POST', sbPath(state.route.name, 'allow'), { domains });
      $('allow-input').value = '';
      say(`allowed ${arr(data.allowed).join(', ') || domains.join(', ')}`);
    } catch (err) {
      say(`allow: ${err.message}`, { error: true }); // the input keeps the text to fix
    } finally {
      button.disabled = false;
      poll('policy', true);
      poll('pending', true);
    }
  }

  // ---------------------------------------------------------------- screen

  function pollScreen(seq) { return pollView('screen', 'screen', seq, renderScreen); }

  function renderScreen(data) {
    const text = typeof data.text === 'string' ? data.text : '';
    const pre = $('screen');
    // Follow the bottom like a terminal, unless the user scrolled up to read.
    const atBottom = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 8;
    const top = pre.scrollTop;
    pre.textContent = text;
    pre.scrollTop = atBottom ? pre.scrollHeight : top;
  }

  // ---------------------------------------------------------------- stop

  function askStop() {
    const name = state.route.name;
    state.stopTarget = name;
    const p = $('confirm-stop-text');
    p.replaceChildren(
      document.createTextNode('Stop the sandbox '),
      el('strong', 'mono', name),
      document.createTextNode('? Its container stops and the agent\u2019s session ends.'),
    );
    $('confirm-stop').showModal();
    $('confirm-stop-no').focus();
  }

  function closeStopDialog() {
    const dialog = $('confirm-stop');
    if (dialog.open) dialog.close();
  }

  async function confirmStop() {
    const name = state.stopTarget;
    const buttons = [$('confirm-stop-yes'), $('confirm-stop-no'), $('stop')];
    buttons.forEach((b) => { b.disabled = true; });
    try {
      const { data } = await api('POST', sbPath(name, 'stop'), {});
      closeStopDialog();
      go('#/');
      say(data.warning ? `stopped ${name}; ${str(data.warning)}` : `stopped ${name}`, { error: !!data.warning });
      poll('list', true);
    } catch (err) {
      closeStopDialog();
      say(`stop ${name}: ${err.message}`, { error: true });
    } finally {
      buttons.forEach((b) => { b.disabled = false; });
    }
  }

  // ---------------------------------------------------------------- wiring

  function debounce(fn, ms) {
    let timer = 0;
    return () => { clearTimeout(timer); timer = setTimeout(fn, ms); };
  }

  function newConnQuery() {
    const box = $('connections').closest('.scroll');
    if (box) box.scrollTop = 0;
    poll('connections', true);
  }

  function wire() {
    window.addEventListener('hashchange', route);
    $('conn-search').addEventListener('input', debounce(newConnQuery, 250));
    $('conn-verdict').addEventListener('change', newConnQuery);
    $('approve').addEventListener('click', askApprove);
    $('confirm-approve-yes').addEventListener('click', () => {
      closeApproveDialog();
      actOnPending('approve', state.confirming, true);
    });
    $('confirm-approve-no').addEventListener('click', closeApproveDialog);
    $('dismiss').addEventListener('click', () => actOnPending('dismiss'));
    $('allow-button').addEventListener('click', allowTyped);
    $('allow-input').addEventListener('keydown', (e) => {
      if (e.key === 'Enter') { e.preventDefault(); allowTyped(); }
    });
    // One listener for every deny button, since the runtime list is redrawn.
    $('runtime').addEventListener('click', (e) => {
      const button = e.target.closest('button.deny');
      const li = button && button.closest('li.runtime');
      if (li) denyEntry(li.getAttribute('data-name'));
    });
    $('stop').addEventListener('click', askStop);
    $('confirm-stop-yes').addEventListener('click', confirmStop);
    $('confirm-stop-no').addEventListener('click', closeStopDialog);
    $('confirm-stop').addEventListener('cancel', (e) => {
      if ($('confirm-stop-yes').disabled) e.preventDefault(); // the stop is under way
    });
    // A click anywhere on a list row opens it, unless the user is selecting text.
    $('sandboxes').tBodies[0].addEventListener('click', (e) => {
      const tr = e.target.closest('tr.sandbox');
      if (!tr || e.target.closest('a') || String(window.getSelection())) return;
      go(`#/s/${encodeURIComponent(tr.getAttribute('data-name'))}`);
    });
  }

  function start() {
    wire();
    route();
    tick();
    setInterval(tick, POLL_MS);
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
