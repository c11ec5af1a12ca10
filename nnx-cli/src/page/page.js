'use strict';

// Error capture comes first, so that a failure anywhere below is visible to the tests
// (they read #nnx-errors from the dumped DOM) and not only in a console nobody watches.
(function installErrorHooks() {
  function report(message) {
    let pre = document.getElementById('nnx-errors');
    if (!pre) {
      pre = document.createElement('pre');
      pre.id = 'nnx-errors';
      pre.hidden = true;
      document.body.appendChild(pre);
    }
    pre.textContent += message + '\n';
    console.error(message);
  }
  window.onerror = (message, source, line, column, error) => {
    report(String(message) + (line ? ' (line ' + line + ':' + column + ')' : '') + (error && error.stack ? '\n' + error.stack : ''));
  };
  window.addEventListener('unhandledrejection', (event) => {
    const r = event.reason;
    report('Unhandled rejection: ' + (r && r.stack ? r.stack : String(r)));
  });
})();

(function main() {
  const T0 = performance.now();
  const VIRTUAL_LIMIT = 2000; // lists longer than this render only their visible rows
  const OVERSCAN = 12;
  const ROW_H = 24;
  const TABLE_ROW_H = 26;
  const FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif';

  const DATA = JSON.parse(document.getElementById('nnx-data').textContent);
  const TENSORS = Array.isArray(DATA.entries) ? DATA.entries : [];
  const TOTAL_BYTES = DATA.total_bytes || TENSORS.reduce((s, t) => s + (t.bytes || 0), 0);

  // ---------------------------------------------------------------- DOM helpers
  // Every string from the data goes in through textContent, text nodes or setAttribute.

  // el('td', 'num', a, b…): an element with a class and children; strings become text nodes.
  function el(tag, cls, ...kids) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    return add(e, ...kids);
  }

  function add(parent, ...kids) {
    for (const k of kids) {
      if (k == null || k === false) continue;
      parent.appendChild(typeof k === 'object' && k.nodeType ? k : document.createTextNode(String(k)));
    }
    return parent;
  }

  function button(label, cls, onClick) {
    const b = el('button', cls, label);
    b.type = 'button';
    if (onClick) b.addEventListener('click', onClick);
    return b;
  }

  // A table with a header row; returns the table and its body to fill.
  function gridTable(cls, heads) {
    const body = el('tbody');
    const row = el('tr', null, ...heads.map((h) => (Array.isArray(h) ? el('th', h[1], h[0]) : el('th', null, h))));
    return { table: el('table', 'grid-table ' + cls, el('thead', null, row), body), body };
  }

  function section(parent, title, extra) {
    return add(parent, el('h2', 'section-title', title, extra ? el('span', 'muted', extra) : null));
  }

  function debounce(fn, ms) {
    let timer = 0;
    return (...args) => { clearTimeout(timer); timer = setTimeout(() => fn(...args), ms); };
  }

  // Coalesces bursts (scroll, resize) into one call per animation frame.
  function perFrame(fn) {
    let pending = 0;
    return () => { if (!pending) pending = requestAnimationFrame(() => { pending = 0; fn(); }); };
  }

  // ---------------------------------------------------------------- formatting

  const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

  function fmtBytes(n) {
    if (n == null || !isFinite(n)) return '–';
    let v = Math.abs(n), u = 0;
    while (v >= 1024 && u < UNITS.length - 1) { v /= 1024; u++; }
    const s = u === 0 ? String(v) : v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2);
    return (n < 0 ? '-' : '') + s + ' ' + UNITS[u];
  }

  function fmtInt(n) {
    return n == null ? '–' : Number(n).toLocaleString('en-US');
  }

  // Parameter counts read best in the units model cards use (134.5M, 7.24B).
  function fmtCount(n) {
    if (n == null) return '–';
    for (const [unit, size, digits] of [['T', 1e12, 2], ['B', 1e9, 2], ['M', 1e6, 1], ['K', 1e4, 1]]) {
      if (Math.abs(n) >= size) return (n / (unit === 'K' ? 1e3 : size)).toFixed(digits) + unit;
    }
    return String(n);
  }

  // Three significant digits, switching to an exponent for tiny or huge values.
  function fmtNum(x) {
    if (x == null) return '–';
    if (typeof x !== 'number' || !isFinite(x) || x === 0) return String(x);
    const a = Math.abs(x);
    if (a >= 1e5 || a < 1e-3) return x.toExponential(2).replace('e+', 'e');
    return String(Number(x.toPrecision(3)));
  }

  function fmtPct(f) {
    if (f == null) return '–';
    const p = f * 100;
    if (p === 0) return '0%';
    if (p < 0.1) return '<0.1%';
    return (p >= 99.95 ? '100' : p.toFixed(1)) + '%';
  }

  const fmtBpw = (x) => (x == null ? '–' : Number(x).toFixed(2));
  const fmtShape = (s) => (!Array.isArray(s) ? '–' : s.length ? s.join('×') : 'scalar');
  const plural = (n, word) => fmtInt(n) + ' ' + word + (n === 1 ? '' : 's');

  // ---------------------------------------------------------------- type colours
  // Cool colours for high precision, warmer ones as bits get fewer; integers stay grey.

  const TYPE_COLORS = {
    F64: '#1e3a8a', F32: '#3b6fd8', F16: '#0ea5c6', BF16: '#14b8a6', F8_E4M3: '#10b981', F8_E5M2: '#0f9f75',
    I64: '#64748b', I32: '#75839a', I16: '#8592a6', I8: '#94a3b8',
    U64: '#6b7a90', U32: '#7d8aa0', U16: '#8d99ad', U8: '#9ba7ba', BOOL: '#b4bfcd',
    Q8_0: '#22a35a', Q8_1: '#2f9e44', Q8_K: '#178a47', Q6_K: '#84b31f',
    Q5_K: '#d4a90a', Q5_0: '#e6c229', Q5_1: '#c99c1c',
    Q4_K: '#f28c28', Q4_0: '#f6a552', Q4_1: '#e0771a', IQ4_XS: '#ef6f3c', IQ4_NL: '#e5602f',
    Q3_K: '#e0493d', IQ3_XXS: '#d63b52', IQ3_XS: '#d1455a', IQ3_S: '#cc3f5f',
    Q2_K: '#b8283f', IQ2_XXS: '#a3214f', IQ2_XS: '#992650', IQ2_S: '#8f2c5a', IQ1_S: '#7a1f4d', IQ1_M: '#6d1f47',
    SEED4: '#9b5de5',
  };
  // Families by bit width, for MLX affine encodings and unlisted Qn / IQn variants.
  const BIT_COLORS = { 8: '#3fb36b', 6: '#97c23a', 5: '#dcb42c', 4: '#f59e3b', 3: '#e5533f', 2: '#b3304a', 1: '#7a1f4d' };
  // Anything else gets one of these, picked by a hash of its name, so it is stable across pages.
  const SPARE_COLORS = ['#8b5cf6', '#ec4899', '#06b6d4', '#a16207', '#4f46e5', '#be185d', '#0e7490', '#7c3aed', '#b45309', '#0369a1'];
  const colorCache = new Map();

  function typeColor(type) {
    if (type == null) return '#cbd5e1';
    let c = colorCache.get(type);
    if (c) return c;
    const t = String(type), up = t.toUpperCase();
    const bits = /(\d+)-bit/i.exec(t) || /^I?Q(\d)/.exec(up);
    c = TYPE_COLORS[up] || (bits && BIT_COLORS[bits[1]]) || (/^F8/.test(up) && '#10b981');
    if (!c) {
      let h = 2166136261;
      for (let i = 0; i < t.length; i++) h = Math.imul(h ^ t.charCodeAt(i), 16777619);
      c = SPARE_COLORS[(h >>> 0) % SPARE_COLORS.length];
    }
    colorCache.set(type, c);
    return c;
  }

  // Text drawn on a type colour must stay readable: dark on light swatches, white otherwise.
  function inkOn(hex) {
    const n = parseInt(hex.slice(1), 16);
    return (0.299 * (n >> 16) + 0.587 * ((n >> 8) & 255) + 0.114 * (n & 255)) / 255 > 0.62 ? '#1f2937' : '#ffffff';
  }

  // Badges are narrow: "MLX affine 4-bit/64" shows as "MLX 4-bit/64", in full on hover.
  function typeBadge(type) {
    const name = type == null ? '?' : String(type);
    const b = el('span', 'badge', name.replace(/^MLX affine /, 'MLX '));
    b.style.background = typeColor(type);
    b.style.color = inkOn(typeColor(type));
    b.setAttribute('title', name);
    return b;
  }

  function swatch(type) {
    const s = el('span', 'swatch');
    s.style.background = typeColor(type);
    return s;
  }

  function legend(types) {
    return el('div', 'legend', ...types.map((t) =>
      el('span', 'legend-item', swatch(t.type), el('span', null, t.type), t.note ? el('span', 'muted', t.note) : null)));
  }

  // ---------------------------------------------------------------- URL hash state
  // #view=NAME&q=QUERY&expand=all|none&zoom=PATH, rewritten in place as the user works.

  const state = { view: 'summary', q: '', expand: '', zoom: '' };
  let ignoreHashChange = false;

  function readHash() {
    const p = new URLSearchParams(location.hash.slice(1));
    state.view = p.get('view') || 'summary';
    state.q = p.get('q') || '';
    state.expand = p.get('expand') || '';
    state.zoom = p.get('zoom') || '';
  }

  function writeHash() {
    const p = new URLSearchParams();
    p.set('view', state.view);
    for (const k of ['q', 'expand']) if (state[k]) p.set(k, state[k]);
    if (state.zoom && state.view === 'treemap') p.set('zoom', state.zoom); // kept while away, shown there
    const hash = '#' + p.toString();
    if (hash === location.hash) return;
    try {
      history.replaceState(null, '', hash);
    } catch (e) {
      ignoreHashChange = true; // some file:// setups refuse replaceState
      location.replace(hash);
    }
  }

  // ---------------------------------------------------------------- clipboard and tooltip

  function copyText(text, btn) {
    const done = () => {
      if (!btn) return;
      btn.textContent = 'copied';
      btn.classList.add('done');
      setTimeout(() => { btn.textContent = 'copy'; btn.classList.remove('done'); }, 1200);
    };
    try {
      if (navigator.clipboard && navigator.clipboard.writeText) {
        navigator.clipboard.writeText(text).then(done, () => { fallbackCopy(text); done(); });
        return;
      }
    } catch (e) { /* fall through to the textarea route */ }
    fallbackCopy(text);
    done();
  }

  // Older engines and some file:// contexts have no async clipboard: select a hidden textarea.
  function fallbackCopy(text) {
    try {
      const ta = el('textarea', 'offscreen');
      ta.value = text;
      ta.setAttribute('readonly', '');
      document.body.appendChild(ta);
      ta.select();
      document.execCommand('copy');
      ta.remove();
    } catch (e) { /* copying is a convenience; failures stay quiet */ }
  }

  const tooltip = document.getElementById('tooltip');

  function showTip(lines, clientX, clientY) {
    tooltip.textContent = '';
    lines.forEach((line, i) => add(tooltip, el('div', i === 0 ? 'tip-title' : 'tip-line', line)));
    tooltip.hidden = false;
    const w = tooltip.offsetWidth, h = tooltip.offsetHeight;
    let x = clientX + 14, y = clientY + 16;
    if (x + w > window.innerWidth - 8) x = Math.max(8, clientX - w - 14);
    if (y + h > window.innerHeight - 8) y = Math.max(8, clientY - h - 12);
    tooltip.style.left = x + 'px';
    tooltip.style.top = y + 'px';
  }

  function hideTip() {
    tooltip.hidden = true;
  }

  // ---------------------------------------------------------------- layout helpers

  // Scroll boxes take the rest of the window, so the page itself rarely scrolls.
  function fitHeight(box, reserve, min) {
    const top = box.getBoundingClientRect().top + window.scrollY;
    box.style.maxHeight = Math.max(min || 260, window.innerHeight - top - (reserve || 28)) + 'px';
  }

  // Sizes a canvas for its CSS box and the screen's pixel ratio; returns its 2D context.
  function sizeCanvas(canvas, w, h) {
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.max(1, Math.round(w * dpr));
    canvas.height = Math.max(1, Math.round(h * dpr));
    canvas.style.width = w + 'px';
    canvas.style.height = h + 'px';
    const ctx = canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return ctx;
  }

  // Shortens a label to the width available, or gives null when nothing useful fits.
  function fitText(ctx, text, width) {
    if (width < 14) return null;
    if (ctx.measureText(text).width <= width) return text;
    let lo = 0, hi = text.length;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (ctx.measureText(text.slice(0, mid) + '…').width <= width) lo = mid; else hi = mid - 1;
    }
    return lo >= 2 ? text.slice(0, lo) + '…' : null;
  }

  // ---------------------------------------------------------------- row lists
  // A scroll box with a sticky header and a body of fixed-height rows. Up to VIRTUAL_LIMIT
  // rows are all in the DOM; beyond that only the visible window (plus overscan) is.

  class RowList {
    constructor(box, body, rowH) {
      Object.assign(this, { box, body, rowH, n: 0, make: null, virtual: false, first: -1, last: -1 });
      box.addEventListener('scroll', perFrame(() => this.virtual && this.paint()));
    }

    set(n, make) {
      Object.assign(this, { n, make, virtual: n > VIRTUAL_LIMIT, first: -1, last: -1 });
      this.body.classList.toggle('virtual', this.virtual);
      this.body.textContent = '';
      this.body.style.height = this.virtual ? n * this.rowH + 'px' : '';
      if (this.virtual) return this.paint();
      const frag = document.createDocumentFragment();
      for (let i = 0; i < n; i++) frag.appendChild(make(i));
      this.body.appendChild(frag);
    }

    paint(force) {
      const top = Math.max(0, this.box.scrollTop - this.body.offsetTop);
      const view = this.box.clientHeight || window.innerHeight;
      const first = Math.max(0, Math.floor(top / this.rowH) - OVERSCAN);
      const last = Math.min(this.n, Math.ceil((top + view) / this.rowH) + OVERSCAN);
      if (!force && first === this.first && last === this.last) return;
      this.first = first;
      this.last = last;
      const frag = document.createDocumentFragment();
      for (let i = first; i < last; i++) {
        const row = this.make(i);
        row.style.top = i * this.rowH + 'px';
        frag.appendChild(row);
      }
      this.body.textContent = '';
      this.body.appendChild(frag);
    }

    // Brings row i into view (virtual lists render it on the way) and returns its element.
    reveal(i) {
      if (this.virtual) {
        const y = i * this.rowH, box = this.box;
        if (y < box.scrollTop) box.scrollTop = y;
        else if (y + this.rowH > box.scrollTop + box.clientHeight - this.body.offsetTop) {
          box.scrollTop = y + this.rowH - box.clientHeight + this.body.offsetTop;
        }
        this.paint();
      }
      const row = this.body.querySelector('[data-i="' + i + '"]');
      if (row && !this.virtual) row.scrollIntoView({ block: 'nearest' });
      return row;
    }
  }

  // ---------------------------------------------------------------- the module hierarchy
  // Built once, on first need, from the dotted names: one node per segment, numeric segments
  // being block indices. Leaves get their own nodes even when a group shares their name.

  let HIER = null;
  let nodeCount = 0;
  const NO_KIDS = Object.freeze([]);

  // One class for every node (leaf or group) keeps property access fast at 100k+ nodes.
  class TreeNode {
    constructor(seg, parent, path, leaf) {
      this.seg = seg;
      this.parent = parent;
      this.path = path;
      this.depth = parent ? parent.depth + 1 : 0;
      this.kids = leaf ? NO_KIDS : [];
      this.t = null; // the tensor, for leaves
      // Sums start as doubles, then zero: V8 keeps them in double form instead of migrating
      // every node when the first byte count past 2^31 lands.
      this.bytes = this.params = 0.5;
      this.bytes = this.params = 0;
      this.count = 0; // tensors below
      this.id = nodeCount++; // index of the node's tree map rectangle
      this.rg = -1; // tree map layout generation its rectangle belongs to
      this.hh = 0; // height of the tree map label band
      this.hit = 0; // tensors below matching the search
      this.isNum = /^\d+$/.test(seg);
      this.numVal = this.isNum ? Number(seg) : 0;
      this.isBlock = false;
      this.lname = '';
      this.sortedTypes = null;
      this.bySize = null;
    }
  }

  // Groups are found by their dotted path: one lookup per tensor in the common case (its
  // parent exists), creating missing ancestors on the way, in a loop (a name may have 100,000
  // parts). No per-node Map. Past MAX_DEPTH levels the rest of a path is one group, so that
  // every walk of the tree stays shallow and rows stay narrow whatever a name holds.
  const MAX_DEPTH = 32;
  function hierarchy() {
    if (HIER) return HIER;
    const root = new TreeNode('', null, '', false);
    const groups = [root], leaves = [], byPath = new Map();

    function groupFor(path) {
      const g = byPath.get(path);
      if (g) return g;
      // The ends of the group's ancestors: its first MAX_DEPTH - 1 dots, then the whole path.
      const ends = [];
      for (let at = path.indexOf('.'); at >= 0 && ends.length < MAX_DEPTH - 1; at = path.indexOf('.', at + 1)) ends.push(at);
      ends.push(path.length);
      let parent = root, start = 0;
      for (const end of ends) {
        const prefix = path.slice(0, end);
        let node = byPath.get(prefix);
        if (!node) {
          node = new TreeNode(path.slice(start, end), parent, prefix, false);
          node.isBlock = node.isNum;
          parent.kids.push(node);
          byPath.set(prefix, node);
          groups.push(node);
        }
        parent = node;
        start = end + 1;
      }
      return parent;
    }

    for (const t of TENSORS) {
      const name = String(t.name);
      const dot = name.lastIndexOf('.');
      const parent = dot < 0 ? root : groupFor(name.slice(0, dot));
      const leaf = new TreeNode(dot < 0 ? name : name.slice(dot + 1), parent, name, true);
      leaf.t = t;
      leaf.bytes = t.bytes || 0;
      leaf.params = t.parameters || 0;
      leaf.count = 1;
      leaf.lname = name.toLowerCase();
      parent.kids.push(leaf);
      leaves.push(leaf);
    }
    // Totals flow bottom-up: leaves into parents, then groups in reverse creation order
    // (a group is always created after its parent).
    for (const leaf of leaves) {
      const p = leaf.parent;
      p.bytes += leaf.bytes;
      p.params += leaf.params;
      p.count += 1;
    }
    for (let i = groups.length - 1; i > 0; i--) {
      const g = groups[i], p = g.parent;
      p.bytes += g.bytes;
      p.params += g.params;
      p.count += g.count;
    }
    for (const g of groups) orderKids(g);
    HIER = { root, groups, leaves, byPath };
    return HIER;
  }

  // Block indices sort numerically in place; other children keep the file's order.
  function orderKids(node) {
    let nums = 0;
    for (const k of node.kids) if (k.isNum) nums++;
    if (nums < 2) return;
    const sorted = node.kids.filter((k) => k.isNum).sort((a, b) => a.numVal - b.numVal || (a.t ? 1 : 0) - (b.t ? 1 : 0));
    let j = 0;
    node.kids = node.kids.map((k) => (k.isNum ? sorted[j++] : k));
  }

  // Bytes per type under a node, largest first. Computed on demand (only rows and
  // rectangles that get drawn need it) and cached, children before parents.
  function typesOf(node) {
    if (node.sortedTypes) return node.sortedTypes;
    // Children first, from a stack rather than by recursion.
    const stack = [node];
    while (stack.length) {
      const n = stack[stack.length - 1];
      if (n.sortedTypes) { stack.pop(); continue; }
      if (n.t) { n.sortedTypes = [[n.t.type, n.bytes]]; stack.pop(); continue; }
      const pending = n.kids.filter((k) => !k.sortedTypes);
      if (pending.length) { stack.push(...pending); continue; }
      const sum = new Map();
      for (const k of n.kids) {
        for (const [type, b] of k.sortedTypes) sum.set(type, (sum.get(type) || 0) + b);
      }
      n.sortedTypes = sum.size ? [...sum].sort((a, b) => b[1] - a[1]) : [[null, 0]];
      stack.pop();
    }
    return node.sortedTypes;
  }

  function kidsBySize(node) {
    if (!node.bySize) node.bySize = node.kids.filter((k) => k.bytes > 0).sort((a, b) => b.bytes - a.bytes);
    return node.bySize;
  }

  // A segment as shown ("a..b" has an empty one). Numeric segments read better with their
  // parent's name in the tree map: "blk.3" rather than "3".
  const segText = (node) => (node.seg === '' ? '(empty)' : node.seg);

  function label(node) {
    return node.isNum && node.parent && node.parent.seg ? node.parent.seg + '.' + node.seg : segText(node);
  }

  function miniBar(node) {
    const bar = el('span', 'minibar');
    const total = node.bytes || 1;
    const parts = [];
    for (const [type, b] of typesOf(node).slice(0, 8)) {
      const s = add(bar, el('span')).lastChild;
      s.style.width = (100 * b / total).toFixed(2) + '%';
      s.style.background = typeColor(type);
      parts.push(type + ' ' + fmtPct(b / total));
    }
    bar.setAttribute('title', parts.join(', '));
    return bar;
  }

  // ================================================================ views

  const VIEWS = [
    { name: 'summary', label: 'Summary', available: () => true, build: buildSummary },
    { name: 'tree', label: 'Modules', count: () => TENSORS.length, available: () => true, build: buildTree },
    { name: 'treemap', label: 'Tree map', available: () => TENSORS.length > 0, build: buildTreemap },
    { name: 'quant', label: 'Quantization map', available: hasQuantMap, build: buildQuant },
    { name: 'stats', label: 'Statistics', count: () => DATA.stats.length, available: () => Array.isArray(DATA.stats), build: buildStats },
    { name: 'plan', label: 'Import plan', count: () => (DATA.plan.rows || []).length, available: () => !!DATA.plan, build: buildPlan },
    { name: 'memory', label: 'Memory', available: () => !!DATA.memory, build: buildMemory },
    { name: 'meta', label: 'Metadata', count: () => (DATA.metadata || []).length, available: () => true, build: buildMeta },
  ];

  function hasQuantMap() {
    const qm = DATA.quant_map;
    return !!(qm && Array.isArray(qm.roles) && qm.roles.length && Array.isArray(qm.cells) && qm.cells.length);
  }

  function buildHeader() {
    const path = DATA.path == null ? '' : String(DATA.path);
    document.title = 'nnx inspect: ' + path;
    document.getElementById('path').textContent = path;
    document.getElementById('format').textContent = DATA.format || 'unknown format';
    document.getElementById('headline').textContent = [
      plural(DATA.count != null ? DATA.count : TENSORS.length, 'tensor'),
      fmtBytes(TOTAL_BYTES),
      fmtCount(DATA.parameters) + ' parameters',
      DATA.bits_per_weight != null ? fmtBpw(DATA.bits_per_weight) + ' bits/weight' : null,
      (DATA.files || []).length > 1 ? DATA.files.length + ' files' : null,
    ].filter(Boolean).join(' · ');
  }

  function buildTabs() {
    const nav = document.getElementById('tabs');
    for (const v of VIEWS.filter((w) => w.available())) {
      v.tab = button(v.label, 'tab', () => selectView(v.name));
      v.tab.setAttribute('role', 'tab');
      v.tab.dataset.view = v.name;
      if (v.count) add(v.tab, el('span', 'tab-count', fmtInt(v.count())));
      nav.appendChild(v.tab);
    }
  }

  function viewByName(name) {
    return VIEWS.find((v) => v.name === name && v.available()) || VIEWS[0];
  }

  function selectView(name) {
    const v = viewByName(name);
    state.view = v.name;
    writeHash();
    showView(v);
  }

  // Builds a view on first use (only the active one is ever built on load) and shows it.
  function showView(v) {
    hideTip();
    for (const w of VIEWS) {
      if (w.section) w.section.hidden = w !== v;
      if (!w.tab) continue;
      w.tab.classList.toggle('active', w === v);
      w.tab.setAttribute('aria-selected', String(w === v));
    }
    if (!v.section) {
      v.section = el('section', 'view view-' + v.name);
      v.section.setAttribute('role', 'tabpanel');
      document.getElementById('main').appendChild(v.section);
      v.api = {}; // stays usable even if the build below throws
      v.api = v.build(v.section) || {};
    } else if (v.api.show) {
      v.api.show();
    }
    document.body.dataset.view = v.name;
  }

  // A search box bound to the shared query (q in the hash), debounced while typing.
  function searchBox(placeholder, onQuery) {
    const input = el('input', 'search');
    input.type = 'search';
    input.placeholder = placeholder;
    input.value = state.q;
    input.setAttribute('aria-label', placeholder);
    input.addEventListener('input', debounce(() => {
      state.q = input.value;
      writeHash();
      onQuery(state.q);
    }, 120));
    return input;
  }

  // ---------------------------------------------------------------- 1. summary

  function buildSummary(root) {
    const card = (k, v, sub) => el('div', 'card', el('div', 'card-k', k), el('div', 'card-v', v), sub ? el('div', 'card-sub', sub) : null);
    add(root, el('div', 'cards',
      card('Format', DATA.format || '–'),
      card('Tensors', fmtInt(DATA.count != null ? DATA.count : TENSORS.length)),
      card('Tensor data', fmtBytes(TOTAL_BYTES), fmtInt(TOTAL_BYTES) + ' bytes'),
      card('Parameters', fmtCount(DATA.parameters), fmtInt(DATA.parameters)),
      card('Bits per weight', fmtBpw(DATA.bits_per_weight), 'effective, all tensors')));

    const types = DATA.types || [];
    if (types.length) root.appendChild(typeStrip(types));

    const files = DATA.files || [];
    section(root, 'Files', String(files.length));
    const ft = gridTable('files', ['File', ['Bytes', 'num'], 'SHA-256']);
    for (const f of files) {
      add(ft.body, el('tr', null, el('td', 'mono', f.name),
        el('td', 'num', fmtBytes(f.bytes), el('span', 'muted small', ' ' + fmtInt(f.bytes))), el('td', 'mono sha', f.sha256 || '–')));
    }
    root.appendChild(ft.table);

    section(root, 'Types', String(types.length));
    const tt = gridTable('types', ['Type', ['Tensors', 'num'], ['Parameters', 'num'], ['Bytes', 'num'], ['Bits/weight', 'num'], ['Share of bytes', 'share']]);
    for (const t of types) {
      const share = TOTAL_BYTES ? t.bytes / TOTAL_BYTES : 0;
      const fill = el('span');
      fill.style.width = (share * 100).toFixed(2) + '%';
      fill.style.background = typeColor(t.type);
      add(tt.body, el('tr', null, el('td', null, swatch(t.type), el('span', 'mono', t.type)), el('td', 'num', fmtInt(t.tensors)),
        el('td', 'num', fmtCount(t.parameters)), el('td', 'num', fmtBytes(t.bytes)), el('td', 'num', fmtBpw(t.bits_per_weight)),
        el('td', 'share', el('span', 'share-bar', fill), el('span', 'share-pct', fmtPct(share)))));
    }
    root.appendChild(tt.table);

    const checks = DATA.validation || [];
    const n = (level) => checks.filter((c) => c.level === level).length;
    const counts = [plural(n('error'), 'error'), plural(n('warning'), 'warning'), n('ok') + ' ok'];
    if (n('info')) counts.push(n('info') + ' info');
    section(root, 'Validation', checks.length ? counts.join(' · ') : 'nothing reported');
    root.appendChild(checkList(checks.map((c) => [c.level, c.message])));
  }

  // Validation results and plan problems: one line each with an icon in the level's colour
  // (information, such as far tails usual in trained models, in a neutral one).
  function checkList(items) {
    const ICON = { ok: '✓', info: 'i', warning: '!', error: '✕' };
    // Appended one by one: a spread of a long list would overflow the call stack.
    const list = el('ul', 'validation');
    for (const [level, message] of items) {
      const lv = ICON[level] ? level : 'warning';
      list.appendChild(el('li', 'check ' + lv, el('span', 'check-icon', ICON[lv]), el('span', 'check-msg', message)));
    }
    return list;
  }

  // One stacked bar of all bytes by type: the whole file's make-up at a glance.
  function typeStrip(types) {
    const strip = el('div', 'type-strip');
    for (const t of types) {
      const share = TOTAL_BYTES ? t.bytes / TOTAL_BYTES : 0;
      if (share <= 0) continue;
      const s = add(strip, el('span', null, share > 0.06 ? t.type : null)).lastChild;
      s.style.flexGrow = String(share);
      s.style.background = typeColor(t.type);
      s.style.color = inkOn(typeColor(t.type));
      s.setAttribute('title', t.type + ': ' + fmtBytes(t.bytes) + ' (' + fmtPct(share) + ')');
    }
    return strip;
  }

  // ---------------------------------------------------------------- 2. module tree

  function buildTree(root) {
    const H = hierarchy();
    // open: the user's toggles; searchOpen: the same while a search is active (default open).
    const tv = { q: null, matched: 0, nodesShown: 0, rows: [], hidden: null, focusIdx: 0, mode: state.expand, open: new Map(), searchOpen: new Map() };
    const count = el('span', 'count');
    const input = searchBox('Filter tensors by name…', () => { applyQuery(); render(); });
    add(root, el('div', 'toolbar', input, count, el('span', 'spacer'),
      button('Expand all', 'btn', () => setMode('all')),
      button('Collapse all', 'btn', () => setMode('none')),
      button('Default', 'btn', () => setMode(''))));
    const head = el('div', 'trow thead', el('div', null, 'Name'), el('div', null, 'Type'), el('div', null, 'Shape'),
      el('div', 'num', 'Parameters'), el('div', 'num', 'Bytes'), el('div'));
    const body = el('div', 'tbody');
    const box = add(root, el('div', 'table-box tree-box', head, body)).lastChild;
    box.id = 'tree';
    box.setAttribute('role', 'tree');
    box.style.setProperty('--cols', 'minmax(260px, 1fr) 110px 130px 124px 84px 56px');
    const list = new RowList(box, body, ROW_H);

    function setMode(mode) {
      tv.mode = state.expand = mode;
      tv.open.clear();
      tv.searchOpen.clear();
      writeHash();
      render();
    }

    // Marks matching leaves and counts them up their ancestors (hit = matching leaves below).
    function applyQuery() {
      const q = state.q.trim().toLowerCase();
      if (q === tv.q) return;
      tv.q = q;
      tv.searchOpen.clear();
      if (!q) {
        for (const g of H.groups) g.hit = g.count;
        for (const l of H.leaves) l.hit = 1;
        tv.matched = H.leaves.length;
        tv.nodesShown = H.groups.length - 1 + H.leaves.length;
        return;
      }
      for (const g of H.groups) g.hit = 0;
      let matched = 0, shown = 0;
      for (const l of H.leaves) {
        l.hit = l.lname.includes(q) ? 1 : 0;
        if (!l.hit) continue;
        matched++;
        shown++;
        for (let p = l.parent; p; p = p.parent) if (p.hit++ === 0 && p.parent) shown++;
      }
      tv.matched = matched;
      tv.nodesShown = shown;
    }

    function isOpen(n) {
      const o = (tv.q ? tv.searchOpen : tv.open).get(n);
      if (o !== undefined) return o;
      if (tv.q || tv.mode === 'all') return true;
      return tv.mode === 'none' ? false : !n.isBlock;
    }

    // Small trees put every row in the DOM (closed subtrees hidden, so every tensor is there);
    // big ones list only the rows under open groups. Rows are bare nodes: no per-row objects.
    function flatten(node, hidden, rows, hide) {
      // Depth first with a stack of [children, next index, hidden] frames, not recursion.
      const stack = [[node.kids, 0, hidden]];
      while (stack.length) {
        const top = stack[stack.length - 1];
        if (top[1] >= top[0].length) { stack.pop(); continue; }
        const k = top[0][top[1]++];
        if (!k.hit) continue;
        rows.push(k);
        if (hide) hide.push(top[2]);
        if (k.t) continue;
        const open = isOpen(k);
        if (open || hide) stack.push([k.kids, 0, top[2] || !open]);
      }
    }

    function render() {
      tv.rows = [];
      tv.hidden = tv.nodesShown <= VIRTUAL_LIMIT ? [] : null;
      flatten(H.root, false, tv.rows, tv.hidden);
      if (tv.focusIdx >= tv.rows.length) tv.focusIdx = 0;
      list.set(tv.rows.length, makeRow);
      box.dataset.shown = String(tv.matched);
      count.textContent = (tv.q ? fmtInt(tv.matched) + ' of ' : '') + plural(H.leaves.length, 'tensor');
      body.classList.toggle('empty', tv.matched === 0);
    }

    function makeRow(i) {
      const n = tv.rows[i], depth = n.depth - 1;
      const row = el('div', n.t ? 'trow row leaf' : 'trow row group');
      row.dataset.i = String(i);
      row.setAttribute(n.t ? 'data-name' : 'data-path', n.path);
      row.setAttribute('role', 'treeitem');
      row.setAttribute('aria-level', String(depth + 1));
      row.tabIndex = i === tv.focusIdx ? 0 : -1;
      if (tv.hidden && tv.hidden[i]) row.hidden = true;
      const name = el('div', 'c-name');
      name.style.paddingLeft = (depth * 16 + 4) + 'px';
      const copy = button('copy', 'copy');
      copy.tabIndex = -1;
      copy.setAttribute('title', 'Copy ' + n.path);
      if (n.t) {
        const t = n.t;
        add(name, el('span', 'tog'), el('span', 'seg', segText(n)),
          t.part_of ? el('span', 'muted small', ' part of ' + String(t.part_of).split('.').slice(-2).join('.')) : null);
        row.setAttribute('title', n.path + (t.file ? '\n' + t.file + ' @ ' + fmtInt(t.file_offset) : '') +
          (t.dtype && t.dtype !== t.type && !t.ggml_type ? '\nstored as ' + t.dtype : ''));
        return add(row, name, el('div', null, typeBadge(t.type)), el('div', 'mono dim', fmtShape(t.shape)),
          el('div', 'num', fmtCount(t.parameters)), el('div', 'num', fmtBytes(t.bytes)), el('div', 'c-copy', copy));
      }
      const open = isOpen(n);
      row.setAttribute('aria-expanded', String(open));
      add(name, el('span', 'tog', open ? '▾' : '▸'), el('span', 'seg', segText(n)));
      // While searching, show how many of the group's tensors match.
      const tensors = tv.q ? fmtInt(n.hit) + ' of ' + fmtCount(n.count) : plural(n.count, 'tensor');
      return add(row, name, el('div', 'c-bar', miniBar(n)), el('div', 'num dim', tensors),
        el('div', 'num', fmtBytes(n.bytes)), el('div', 'c-copy', copy));
    }

    function toggle(i, want) {
      const n = tv.rows[i];
      if (!n || n.t) return;
      const next = want === undefined ? !isOpen(n) : want;
      if (next === isOpen(n)) return;
      (tv.q ? tv.searchOpen : tv.open).set(n, next);
      render();
      focusRow(tv.rows.indexOf(n));
    }

    // Roving focus: one row is in the tab order; arrows move it, re-rendering virtual lists.
    function focusRow(i) {
      if (i < 0) return;
      const old = body.querySelector('[tabindex="0"]');
      if (old) old.tabIndex = -1;
      tv.focusIdx = i;
      const row = list.reveal(i);
      if (row) { row.tabIndex = 0; row.focus({ preventScroll: list.virtual }); }
    }

    function step(i, dir) {
      let j = i + dir;
      while (tv.hidden && j >= 0 && j < tv.rows.length && tv.hidden[j]) j += dir;
      return j >= 0 && j < tv.rows.length ? j : i;
    }

    box.addEventListener('click', (e) => {
      const row = e.target.closest('.row');
      if (!row) return;
      const i = Number(row.dataset.i), n = tv.rows[i];
      const copy = e.target.closest('.copy');
      if (copy) return copyText(n.path, copy);
      if (String(window.getSelection()).length) return; // let people select text
      if (n.t) focusRow(i); else toggle(i);
    });

    box.addEventListener('keydown', (e) => {
      const row = e.target.closest('.row');
      if (!row) return;
      const i = Number(row.dataset.i), n = tv.rows[i];
      const keys = {
        ArrowDown: () => focusRow(step(i, 1)),
        ArrowUp: () => focusRow(step(i, -1)),
        Home: () => focusRow(0),
        End: () => focusRow(step(tv.rows.length, -1)),
        ArrowRight: () => (!n.t && !isOpen(n) ? toggle(i, true) : focusRow(step(i, 1))),
        ArrowLeft: () => (!n.t && isOpen(n) ? toggle(i, false) : n.parent.parent && focusRow(tv.rows.indexOf(n.parent))),
        Enter: () => toggle(i),
        ' ': () => toggle(i),
        c: () => copyText(n.path, row.querySelector('.copy')),
      };
      if (!keys[e.key]) return;
      e.preventDefault();
      keys[e.key]();
    });

    applyQuery();
    fitHeight(box);
    render();
    return {
      show() {
        input.value = state.q;
        if (state.expand !== tv.mode) { tv.mode = state.expand; tv.open.clear(); }
        applyQuery();
        fitHeight(box);
        render();
      },
      resize() { fitHeight(box); if (list.virtual) list.paint(true); },
    };
  }

  // ---------------------------------------------------------------- 3. tree map
  // Squarified layout of bytes over the module hierarchy, painted on one canvas. Rectangles
  // are batched by colour into single paths; nothing below ~1 px is laid out at all.

  function buildTreemap(root) {
    const H = hierarchy();
    // Rectangles live in one Float64Array, (x, y, w, h) per node id: no per-node objects.
    const R = new Float64Array(4 * nodeCount);
    const rx = (n) => R[4 * n.id], ry = (n) => R[4 * n.id + 1], rw = (n) => R[4 * n.id + 2], rh = (n) => R[4 * n.id + 3];
    const tm = { root: zoomNode(), gen: 0, fills: new Map(), groups: [], leaves: [], w: 0, h: 0 };
    const crumbs = el('nav', 'crumbs');
    crumbs.setAttribute('aria-label', 'Zoom path');
    const out = button('Zoom out', 'btn', () => zoomTo(tm.root.parent));
    const canvas = el('canvas');
    canvas.id = 'treemap';
    canvas.setAttribute('role', 'img');
    const overlay = el('canvas', 'overlay'); // hover outlines, so the map itself is never redrawn for them
    const wrap = el('div', 'canvas-wrap', canvas, overlay);
    add(root, el('div', 'toolbar', crumbs, el('span', 'spacer'), el('span', 'muted small', 'click a group to zoom in · Esc to zoom out'), out),
      wrap, legend(DATA.types || []));

    function zoomNode() {
      return (state.zoom && H.byPath.get(state.zoom)) || H.root;
    }

    function zoomTo(node) {
      if (!node || node.t) return;
      tm.root = node;
      state.zoom = node === H.root ? '' : node.path;
      writeHash();
      draw();
    }

    function renderCrumbs() {
      crumbs.textContent = '';
      const chain = [];
      for (let n = tm.root; n; n = n.parent) chain.unshift(n);
      chain.forEach((n, i) => {
        if (i) add(crumbs, el('span', 'crumb-sep', '›'));
        const text = n === H.root ? 'all ' + fmtBytes(H.root.bytes) : label(n);
        if (n !== tm.root) add(crumbs, button(text, 'crumb', () => zoomTo(n)));
        else add(crumbs, el('span', 'crumb current', i ? text + ' · ' + fmtBytes(n.bytes) : text));
      });
      out.disabled = tm.root === H.root;
      canvas.setAttribute('aria-label', 'Tree map of ' + (tm.root.path || 'all tensors') + ' by bytes');
    }

    function fill(color, x, y, w, h) {
      let a = tm.fills.get(color);
      if (!a) tm.fills.set(color, (a = []));
      a.push(x, y, w, h);
    }

    function layoutNode(n, x, y, w, h) {
      const o = 4 * n.id;
      R[o] = x; R[o + 1] = y; R[o + 2] = w; R[o + 3] = h;
      n.rg = tm.gen;
      n.hh = 0;
      if (n.t) {
        tm.leaves.push(n);
        return fill(typeColor(n.t.type), x, y, w, h);
      }
      if (n !== tm.root) tm.groups.push(n);
      if (w < 4 || h < 4) return fill(typeColor(typesOf(n)[0][0]), x, y, w, h); // too small to subdivide
      if (n !== tm.root && w >= 44 && h >= 34) n.hh = 15;
      squarify(n, kidsBySize(n), x + 1, y + 1 + n.hh, w - 2, h - 2 - n.hh);
    }

    // Squarified tree map (Bruls et al.): grow a strip along the short side while the worst
    // aspect ratio improves, then lay it out and continue in the remaining rectangle.
    function squarify(parent, kids, x, y, w, h) {
      if (parent.bytes <= 0 || w <= 0 || h <= 0) return;
      const scale = (w * h) / parent.bytes;
      let i = 0;
      while (i < kids.length) {
        const short = Math.min(w, h);
        if (short <= 0.5) break;
        if (kids[i].bytes * scale < 1) { // the rest is sub-pixel: one block in the parent's main type
          fill(typeColor(typesOf(parent)[0][0]), x, y, w, h);
          break;
        }
        let sum = 0, min = Infinity, max = 0, best = Infinity, j = i;
        for (; j < kids.length; j++) {
          const a = kids[j].bytes * scale;
          const s = sum + a, mn = Math.min(min, a), mx = Math.max(max, a);
          const worst = Math.max((short * short * mx) / (s * s), (s * s) / (short * short * mn));
          if (j > i && worst > best) break;
          best = worst; sum = s; min = mn; max = mx;
        }
        const thick = sum / short;
        for (let k = i, pos = 0; k < j; k++) {
          const len = (kids[k].bytes * scale) / thick;
          if (w >= h) layoutNode(kids[k], x, y + pos, thick, len);
          else layoutNode(kids[k], x + pos, y, len, thick);
          pos += len;
        }
        if (w >= h) { x += thick; w -= thick; } else { y += thick; h -= thick; }
        i = j;
      }
    }

    function draw() {
      renderCrumbs();
      const w = tm.w = Math.max(320, wrap.clientWidth);
      const h = tm.h = Math.max(320, Math.min(1600, window.innerHeight - wrap.getBoundingClientRect().top - window.scrollY - 52));
      const ctx = sizeCanvas(canvas, w, h);
      sizeCanvas(overlay, w, h);
      Object.assign(tm, { gen: tm.gen + 1, fills: new Map(), groups: [], leaves: [] });
      ctx.fillStyle = '#eef1f5';
      ctx.fillRect(0, 0, w, h);
      if (tm.root.bytes <= 0) {
        ctx.fillStyle = '#64748b';
        ctx.font = '14px ' + FONT;
        return ctx.fillText('No tensor bytes to show.', 16, 28);
      }
      layoutNode(tm.root, 0, 0, w, h);
      for (const [color, a] of tm.fills) {
        ctx.fillStyle = color;
        ctx.beginPath();
        for (let i = 0; i < a.length; i += 4) ctx.rect(a[i], a[i + 1], a[i + 2], a[i + 3]);
        ctx.fill();
      }
      drawEdges(ctx);
      drawLabels(ctx);
    }

    // Thin light lines between leaves, darker frames and header bands for groups.
    function drawEdges(ctx) {
      ctx.lineWidth = 1;
      ctx.strokeStyle = 'rgba(255,255,255,0.55)';
      ctx.beginPath();
      for (const n of tm.leaves) if (rw(n) >= 4 && rh(n) >= 4) ctx.rect(rx(n) + 0.5, ry(n) + 0.5, rw(n) - 1, rh(n) - 1);
      ctx.stroke();
      ctx.fillStyle = '#f8fafc';
      for (const g of tm.groups) if (g.hh) ctx.fillRect(rx(g) + 1, ry(g) + 1, rw(g) - 2, g.hh);
      ctx.strokeStyle = 'rgba(30,41,59,0.55)';
      ctx.beginPath();
      for (const g of tm.groups) if (rw(g) >= 4 && rh(g) >= 4) ctx.rect(rx(g) + 0.5, ry(g) + 0.5, rw(g) - 1, rh(g) - 1);
      ctx.stroke();
    }

    function drawLabels(ctx) {
      ctx.textBaseline = 'middle';
      ctx.font = '600 11px ' + FONT;
      ctx.fillStyle = '#1e293b';
      for (const g of tm.groups) {
        if (!g.hh) continue;
        const text = fitText(ctx, label(g) + '  ' + fmtBytes(g.bytes), rw(g) - 8) || fitText(ctx, label(g), rw(g) - 8);
        if (text) ctx.fillText(text, rx(g) + 4, ry(g) + 1 + g.hh / 2);
      }
      ctx.font = '11px ' + FONT;
      for (const n of tm.leaves) {
        if (rw(n) < 46 || rh(n) < 16) continue;
        const text = fitText(ctx, segText(n), rw(n) - 8);
        if (!text) continue;
        ctx.fillStyle = inkOn(typeColor(n.t.type));
        ctx.fillText(text, rx(n) + 4, ry(n) + 9);
        const sub = rh(n) >= 30 && fitText(ctx, n.t.type + ' · ' + fmtBytes(n.bytes), rw(n) - 8);
        if (sub) {
          ctx.globalAlpha = 0.8;
          ctx.fillText(sub, rx(n) + 4, ry(n) + 22);
          ctx.globalAlpha = 1;
        }
      }
    }

    // Walks down from the zoom root through laid-out children to the deepest one under the
    // pointer. `head` is the deepest group whose label band is under it; `top` the first step.
    function hitTest(x, y) {
      let n = tm.root, head = null, top = null;
      for (;;) {
        if (n.hh && n !== tm.root && y < ry(n) + 1 + n.hh) head = n;
        if (n.t) break;
        const next = kidsBySize(n).find((k) => k.rg === tm.gen && x >= rx(k) && x < rx(k) + rw(k) && y >= ry(k) && y < ry(k) + rh(k));
        if (!next) break;
        n = next;
        top = top || n;
      }
      return { node: n === tm.root ? null : n, head, top };
    }

    function hover(node) {
      const ctx = overlay.getContext('2d');
      ctx.clearRect(0, 0, tm.w, tm.h);
      if (!node) return;
      ctx.lineWidth = 2;
      ctx.strokeStyle = '#0f172a';
      ctx.strokeRect(rx(node) + 1, ry(node) + 1, Math.max(1, rw(node) - 2), Math.max(1, rh(node) - 2));
      const g = node.t ? node.parent : null;
      if (g && g !== tm.root && g.rg === tm.gen) { // dashed frame around the leaf's module
        ctx.lineWidth = 1;
        ctx.setLineDash([4, 3]);
        ctx.strokeRect(rx(g) + 0.5, ry(g) + 0.5, rw(g) - 1, rh(g) - 1);
        ctx.setLineDash([]);
      }
    }

    function describe(n) {
      const t = n.t;
      if (t) {
        return [n.path, 'type ' + t.type + (t.dtype && t.dtype !== t.type && !t.ggml_type ? ' (stored ' + t.dtype + ')' : ''), 'shape ' + fmtShape(t.shape),
          fmtBytes(t.bytes) + ' · ' + fmtCount(t.parameters) + ' parameters', t.part_of ? 'part of ' + t.part_of : null].filter(Boolean);
      }
      const types = typesOf(n).slice(0, 4).map(([type, b]) => type + ' ' + fmtPct(b / (n.bytes || 1))).join(', ');
      return [n.path, plural(n.count, 'tensor') + ' · ' + fmtBytes(n.bytes), types, 'click to zoom in'];
    }

    const point = (e) => { const r = canvas.getBoundingClientRect(); return [e.clientX - r.left, e.clientY - r.top]; };

    overlay.addEventListener('mousemove', (e) => {
      const hit = hitTest(...point(e));
      const n = hit.head || hit.node;
      hover(n);
      if (n) showTip(describe(n), e.clientX, e.clientY); else hideTip();
      overlay.style.cursor = hit.head || (hit.top && !hit.top.t) ? 'zoom-in' : 'default';
    });
    overlay.addEventListener('mouseleave', () => { hover(null); hideTip(); });
    overlay.addEventListener('click', (e) => {
      const hit = hitTest(...point(e));
      const target = hit.head || hit.top;
      if (target && !target.t) { hideTip(); zoomTo(target); }
    });
    document.addEventListener('keydown', (e) => {
      if (e.key === 'Escape' && state.view === 'treemap' && tm.root.parent) zoomTo(tm.root.parent);
    });

    draw();
    return { show() { tm.root = zoomNode(); draw(); }, resize: draw };
  }

  // ---------------------------------------------------------------- 4. quantization map
  // One row per block, one column per role, each cell in its type's colour; tensors outside
  // blocks get their own row, pinned under the role names. Drawn on a sticky canvas inside a
  // scroll box, so only visible rows are ever painted, however many layers there are.

  function buildQuant(root) {
    const qm = DATA.quant_map, roles = qm.roles, nCols = roles.length;
    // Rows are blocks 0 .. layers - 1 when that is a plausible count; a name may give a block
    // index of billions, and then only the blocks that have cells get rows, in order.
    const DENSE_LAYERS = 1 << 16;
    const layerCount = Number(qm.layers) || 0;
    let layerIds = null; // row -> block index, for sparse rows
    if (!(layerCount <= DENSE_LAYERS)) {
      layerIds = [...new Set(qm.cells.filter((c) => c.layer != null).map((c) => Number(c.layer)))].sort((a, b) => a - b);
    }
    const nLayers = layerIds ? layerIds.length : Math.max(0, layerCount);
    const rowOf = layerIds ? new Map(layerIds.map((id, r) => [id, r])) : null;
    const OUT = nLayers; // grid row of the tensors outside blocks
    const col = new Map(roles.map((r, i) => [r, i]));
    const outside = qm.cells.some((c) => c.layer == null);
    const grid = new Array((nLayers + 1) * nCols);
    const present = new Map();
    for (const c of qm.cells) {
      const ci = col.get(c.role);
      const ri = c.layer == null ? OUT : rowOf ? rowOf.get(Number(c.layer)) : c.layer;
      if (ci === undefined || !(ri >= 0 && ri <= nLayers)) continue;
      (grid[ri * nCols + ci] || (grid[ri * nCols + ci] = [])).push(c);
      if (!present.has(c.type)) present.set(c.type, c.bits_per_weight);
    }

    const LABEL_W = 104, SEP = 6;
    const canvas = el('canvas', 'qmap-canvas');
    canvas.setAttribute('role', 'img');
    canvas.setAttribute('aria-label', 'Quantization map: ' + nLayers + ' layers × ' + nCols + ' roles');
    const spacer = el('div');
    const box = el('div', 'qmap-box', canvas, spacer);
    box.id = 'quant-map';
    const legendTypes = [...present].sort((a, b) => (b[1] || 0) - (a[1] || 0))
      .map(([type, bpw]) => ({ type, note: bpw != null ? fmtBpw(bpw) + ' bpw' : null }));
    add(root, el('div', 'toolbar', legend(legendTypes)), box, el('p', 'muted small', plural(nLayers, 'layer') + ' × ' + plural(nCols, 'role') +
      (outside ? '; the first row holds tensors outside blocks' : '') + '. Hover a cell for its tensor.'));

    // Geometry: head = role names, pin = head plus the outside row, layer rows scroll below.
    const g = { colW: 0, rowH: 0, outH: 0, headH: 0, pinH: 0, rotate: false, viewH: 0, w: 0 };

    function measure() {
      const w = g.w = Math.max(360, box.clientWidth);
      const ctx = canvas.getContext('2d');
      ctx.font = '600 11px ' + FONT;
      g.colW = Math.max(14, Math.min(72, Math.floor((w - LABEL_W - 8) / Math.max(1, nCols))));
      const widest = Math.max(...roles.map((r) => ctx.measureText(r).width));
      g.rotate = widest > g.colW - 4;
      g.headH = g.rotate ? Math.min(110, Math.ceil(widest * 0.72) + 14) : 24;
      const avail = Math.max(240, window.innerHeight - box.getBoundingClientRect().top - window.scrollY - 72);
      g.outH = outside ? 20 : 0;
      g.pinH = g.headH + (outside ? g.outH + SEP : 0);
      g.rowH = Math.max(6, Math.min(20, Math.floor((avail - g.pinH) / Math.max(1, nLayers))));
      const content = g.pinH + nLayers * g.rowH + 2;
      g.viewH = Math.min(content, avail);
      box.style.height = g.viewH + 2 + 'px'; // plus the border
      spacer.style.height = Math.max(0, content - g.viewH) + 'px';
    }

    // Grid row under a canvas y: OUT for the pinned row, a layer, or -1.
    function rowAt(y) {
      if (y < g.headH) return -1;
      if (y < g.pinH) return outside && y < g.headH + g.outH ? OUT : -1;
      const r = Math.floor((y - g.pinH + box.scrollTop) / g.rowH);
      return r < nLayers ? r : -1;
    }

    const rowLabel = (r) => (r === OUT ? 'outside blocks' : 'layer ' + (layerIds ? layerIds[r] : r));

    // Label every row when there is room, else every 2nd/5th/10th/... layer.
    function labelStep() {
      const need = 13 / g.rowH;
      return need <= 1 ? 1 : [2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000].find((m) => m >= need) || 1000;
    }

    function draw() {
      const ctx = sizeCanvas(canvas, g.w, g.viewH);
      const scroll = box.scrollTop, gridW = LABEL_W + nCols * g.colW, step = labelStep();
      ctx.clearRect(0, 0, g.w, g.viewH);
      ctx.font = Math.min(11, g.rowH + 3) + 'px ' + FONT;
      for (let r = Math.max(0, Math.floor(scroll / g.rowH) - 1); r < nLayers; r++) {
        const y = g.pinH + r * g.rowH - scroll;
        if (y > g.viewH) break;
        if (r % 2 === 1) {
          ctx.fillStyle = '#f6f8fa';
          ctx.fillRect(0, y, gridW, g.rowH);
        }
        if (r % step === 0) { // small rows: hang the label from the row's top so none is clipped
          ctx.fillStyle = '#475569';
          ctx.textBaseline = step > 1 ? 'top' : 'middle';
          ctx.fillText(rowLabel(r), 6, step > 1 ? y : y + g.rowH / 2);
        }
        for (let c = 0; c < nCols; c++) drawCell(ctx, grid[r * nCols + c], LABEL_W + c * g.colW, y, g.rowH);
      }
      drawPinned(ctx, gridW);
    }

    // A cell shows one stripe per distinct type (experts or q/k/v parts may differ).
    function drawCell(ctx, cells, x, y, h) {
      const w = g.colW - 1;
      h -= h >= 8 ? 1 : 0;
      if (!cells) {
        if (h < 9) return;
        ctx.strokeStyle = '#e5e9ef';
        return ctx.strokeRect(x + 0.5, y + 0.5, w - 1, h - 1);
      }
      const types = [...new Set(cells.map((c) => c.type))];
      const sw = w / types.length;
      types.forEach((type, i) => {
        ctx.fillStyle = typeColor(type);
        ctx.fillRect(x + i * sw, y, Math.ceil(sw), h);
      });
      if (types.length === 1 && g.colW >= 40 && h >= 13) {
        ctx.font = '10px ' + FONT;
        ctx.textBaseline = 'middle';
        ctx.fillStyle = inkOn(typeColor(types[0]));
        const text = fitText(ctx, String(types[0]).replace(/^MLX affine /, ''), w - 6);
        if (text) ctx.fillText(text, x + 4, y + h / 2 + 0.5);
      }
    }

    // Role names, then the outside-blocks row: painted last so layer rows scroll under them.
    function drawPinned(ctx, gridW) {
      ctx.fillStyle = '#ffffff';
      ctx.fillRect(0, 0, g.w, g.pinH);
      ctx.font = '600 11px ' + FONT;
      ctx.fillStyle = '#334155';
      ctx.textBaseline = 'middle';
      roles.forEach((role, c) => {
        const x = LABEL_W + c * g.colW + g.colW / 2;
        ctx.save();
        if (g.rotate) {
          ctx.translate(x - 3, g.headH - 6);
          ctx.rotate(-Math.PI / 4);
          ctx.fillText(role, 0, 0);
        } else {
          ctx.textAlign = 'center';
          ctx.fillText(role, x, g.headH / 2);
        }
        ctx.restore();
      });
      if (outside) {
        const y = g.headH;
        ctx.fillStyle = '#eef2f7';
        ctx.fillRect(0, y, gridW, g.outH);
        ctx.font = 'italic 11px ' + FONT;
        ctx.fillStyle = '#475569';
        ctx.fillText(rowLabel(OUT), 6, y + g.outH / 2);
        for (let c = 0; c < nCols; c++) drawCell(ctx, grid[OUT * nCols + c], LABEL_W + c * g.colW, y, g.outH);
      }
      ctx.strokeStyle = '#cbd3dd';
      ctx.beginPath();
      ctx.moveTo(0, g.pinH - 0.5);
      ctx.lineTo(gridW, g.pinH - 0.5);
      ctx.stroke();
    }

    box.addEventListener('scroll', perFrame(draw));
    canvas.addEventListener('mousemove', (e) => {
      const rect = canvas.getBoundingClientRect();
      const r = rowAt(e.clientY - rect.top);
      const c = Math.floor((e.clientX - rect.left - LABEL_W) / g.colW);
      const cells = r >= 0 && c >= 0 && c < nCols ? grid[r * nCols + c] : null;
      if (!cells) return hideTip();
      const lines = [rowLabel(r) + ' · ' + roles[c]].concat(cells.slice(0, 8).map((cell) =>
        cell.tensor + '  ' + cell.type + (cell.bits_per_weight != null ? ' · ' + fmtBpw(cell.bits_per_weight) + ' bpw' : '')));
      if (cells.length > 8) lines.push('… and ' + (cells.length - 8) + ' more');
      showTip(lines, e.clientX, e.clientY);
    });
    canvas.addEventListener('mouseleave', hideTip);

    const redraw = () => { measure(); draw(); };
    redraw();
    return { show: redraw, resize: redraw };
  }

  // ---------------------------------------------------------------- filterable tables
  // The statistics and the import plan: a search box (the shared q), a checkbox keeping only
  // flagged rows, headers that sort, and a RowList body.

  function filterTable(root, o) {
    const sort = { col: null, dir: 1 };
    let order = [];
    const count = el('span', 'count');
    const input = searchBox(o.placeholder, refresh);
    const only = el('input');
    only.type = 'checkbox';
    only.addEventListener('change', refresh);
    const flagged = o.items.filter(o.flagged).length;
    add(root, el('div', 'toolbar', input, el('label', 'check-label', only, ' ' + o.flagLabel + ' (' + fmtInt(flagged) + ')'), count));
    const head = el('div', 'trow thead'), body = el('div', 'tbody');
    const box = add(root, el('div', 'table-box ' + o.cls, head, body)).lastChild;
    box.style.setProperty('--cols', o.columns.map((c) => c.width).join(' '));
    const list = new RowList(box, body, TABLE_ROW_H);

    // Column headers sort on click: ascending, then descending.
    for (const c of o.columns) {
      if (!c.get) { head.appendChild(el('div', 'th', c.label)); continue; }
      head.appendChild(button(c.label, 'th sortable', (e) => {
        sort.dir = sort.col === c ? -sort.dir : 1;
        sort.col = c;
        for (const x of head.children) { x.removeAttribute('aria-sort'); x.classList.remove('asc', 'desc'); }
        e.currentTarget.setAttribute('aria-sort', sort.dir > 0 ? 'ascending' : 'descending');
        e.currentTarget.classList.add(sort.dir > 0 ? 'asc' : 'desc');
        refresh();
      }));
    }

    function refresh() {
      const q = state.q.trim().toLowerCase();
      order = [];
      o.items.forEach((item, i) => {
        if ((!only.checked || o.flagged(item)) && (!q || o.match(item, q))) order.push(i);
      });
      if (sort.col) sortRows(order, o.items, sort.col, sort.dir);
      list.set(order.length, (i) => {
        const row = o.row(o.items[order[i]]);
        row.dataset.i = String(i);
        return row;
      });
      count.textContent = fmtInt(order.length) + ' of ' + plural(o.items.length, o.noun);
    }

    fitHeight(box, o.reserve);
    refresh();
    return {
      show() { if (input.value !== state.q) { input.value = state.q; refresh(); } fitHeight(box, o.reserve); },
      resize() { fitHeight(box, o.reserve); if (list.virtual) list.paint(true); },
    };
  }

  // Sorts row indices by a column's key; missing values always go last.
  function sortRows(order, items, column, dir) {
    const keys = new Map(order.map((i) => [i, column.get(items[i])]));
    order.sort((a, b) => {
      const x = keys.get(a), y = keys.get(b);
      if (x == null || y == null) return x == null && y == null ? a - b : x == null ? 1 : -1;
      const c = typeof x === 'string' ? x.localeCompare(y) : x - y;
      return c * dir || a - b;
    });
  }

  const lower = (s) => String(s == null ? '' : s).toLowerCase();

  // ---------------------------------------------------------------- 5. statistics

  function buildStats(view) {
    const root = add(view, el('div')).lastChild;
    root.id = 'stats';
    const num = (key, label, width) => ({ label, width, get: (s) => s[key] });
    // A problem (NaN, infinities, a weight of zeros) is marked; far tails are a note.
    const note = (s) => (s.problem != null ? s.problem : s.outlier);
    const columns = [
      { label: 'Name', width: 'minmax(200px, 1fr)', get: (s) => String(s.name) },
      { label: 'Encoding', width: '84px', get: (s) => String(s.encoding) },
      { label: 'Shape', width: '96px', get: (s) => (s.shape || []).reduce((a, b) => a * b, 1) },
      num('min', 'Min', '62px'), num('max', 'Max', '62px'), num('mean', 'Mean', '62px'), num('std', 'Std', '58px'),
      num('absmax', 'Absmax', '62px'), num('zero_fraction', 'Zero', '50px'), num('nans', 'NaN', '40px'), num('infs', 'Inf', '36px'),
      { label: 'Hist', width: '66px' },
      { label: 'Finding', width: 'minmax(120px, 0.7fr)', get: (s) => (note(s) == null ? null : String(note(s))) },
    ];
    return filterTable(root, {
      cls: 'stats-box', items: DATA.stats, columns, noun: 'tensor',
      placeholder: 'Filter by name…', flagLabel: 'with findings only',
      flagged: (s) => note(s) != null,
      match: (s, q) => lower(s.name).includes(q),
      row(s) {
        const bad = (v) => 'num' + (v ? ' bad' : '');
        const row = el('div', 'trow row' + (s.problem != null ? ' outlier' : ''),
          el('div', 'mono ellip', s.name), el('div', null, typeBadge(s.encoding)), el('div', 'mono dim', fmtShape(s.shape)),
          el('div', 'num', fmtNum(s.min)), el('div', 'num', fmtNum(s.max)), el('div', 'num', fmtNum(s.mean)), el('div', 'num', fmtNum(s.std)),
          el('div', 'num', fmtNum(s.absmax)), el('div', 'num', fmtPct(s.zero_fraction)), el('div', bad(s.nans), fmtInt(s.nans)),
          el('div', bad(s.infs), fmtInt(s.infs)), el('div', null, histogram(s)),
          el('div', 'ellip ' + (s.problem != null ? 'reason' : 'tail-note'), note(s)));
        row.setAttribute('data-name', String(s.name));
        row.firstChild.setAttribute('title', String(s.name));
        if (note(s) != null) row.lastChild.setAttribute('title', String(note(s)));
        return row;
      },
    });
  }

  // A 16-bin histogram as one SVG path (square-root heights, so tails stay visible).
  function histogram(s) {
    const NS = 'http://www.w3.org/2000/svg', W = 64, H = 18;
    const svg = document.createElementNS(NS, 'svg');
    for (const [k, v] of [['viewBox', '0 0 ' + W + ' ' + H], ['width', W], ['height', H], ['class', 'hist']]) svg.setAttribute(k, String(v));
    const bins = Array.isArray(s.histogram) ? s.histogram : [];
    const max = Math.sqrt(Math.max(0, ...bins));
    if (!bins.length || max <= 0) return svg;
    const bw = W / bins.length;
    let d = '';
    bins.forEach((c, i) => {
      const h = c > 0 ? Math.max(1, Math.round((Math.sqrt(c) / max) * (H - 1))) : 0;
      if (h) d += 'M' + (i * bw).toFixed(2) + ' ' + H + 'v-' + h + 'h' + (bw - 0.6).toFixed(2) + 'v' + h + 'z';
    });
    const path = document.createElementNS(NS, 'path');
    path.setAttribute('d', d);
    const title = document.createElementNS(NS, 'title');
    title.textContent = 'range ' + fmtNum(s.min) + ' … ' + fmtNum(s.max);
    svg.append(path, title);
    return svg;
  }

  // ---------------------------------------------------------------- 6. import plan

  function buildPlan(view) {
    const root = add(view, el('div')).lastChild;
    root.id = 'plan';
    const plan = DATA.plan, rows = plan.rows || [], problems = plan.problems || [], unexpected = plan.unexpected || [];
    const kv = (k, v) => el('span', 'kv', el('span', 'k', k), el('span', 'mono', v == null ? '–' : v));
    add(root, el('div', 'plan-head', kv('architecture', plan.architecture), kv('target', plan.target),
      el('span', 'status-pill ' + (plan.valid ? 'ok' : 'bad'), plan.valid ? '✓ valid' : '✕ invalid · ' + plural(problems.length, 'problem')),
      el('span', 'muted', plural(rows.length, 'field'))));

    const str = (key) => (r) => (r[key] == null ? null : String(r[key]));
    const api = filterTable(root, {
      cls: 'plan-box', items: rows, noun: 'field', reserve: 120,
      placeholder: 'Filter fields and sources…', flagLabel: 'problems only',
      columns: [
        { label: 'Model field', width: 'minmax(180px, 1fr)', get: str('field') },
        { label: '← Source entry', width: 'minmax(170px, 1fr)', get: str('source') },
        { label: 'Ops', width: 'minmax(200px, 1.1fr)', get: (r) => (r.ops || []).length },
        { label: 'Stored', width: '136px', get: str('stored_dtype') },
        { label: '→ Model', width: '136px', get: str('dtype') },
        { label: 'Status', width: 'minmax(120px, 0.8fr)', get: str('action') },
      ],
      flagged: (r) => r.problem != null || r.action === 'invalid',
      match: (r, q) => lower(r.field).includes(q) || lower(r.source).includes(q) || lower(r.problem).includes(q),
      row: planRow,
    });

    section(root, 'Unexpected entries', unexpected.length ? unexpected.length + ' not read by the model' : 'none');
    if (unexpected.length) {
      add(root, el('ul', 'plain-list mono', ...unexpected.slice(0, 500).map((u) => el('li', null, u)),
        unexpected.length > 500 ? el('li', 'muted', '… and ' + (unexpected.length - 500) + ' more') : null));
    }
    section(root, 'Problems', problems.length ? String(problems.length) : 'none');
    if (problems.length) root.appendChild(checkList(problems.slice(0, 1000).map((p) => ['error', p])));
    if (problems.length > 1000) add(root, el('p', 'muted', '… and ' + (problems.length - 1000) + ' more'));
    return api;
  }

  function planRow(r) {
    const action = ['read', 'tie', 'keep', 'hook', 'invalid'].includes(r.action) ? r.action : 'other';
    const ops = r.ops || [];
    const text = action === 'tie' ? 'tie' + (r.tie ? ' → ' + r.tie : '') : action === 'keep' ? 'keep (optional)' : String(r.action);
    const status = el('div', 'ellip status', el('span', 'act ' + action, text), r.problem != null ? el('span', 'problem', ' ' + r.problem) : null);
    const row = el('div', 'trow row plan-row' + (r.problem != null || action === 'invalid' ? ' has-problem' : ''),
      el('div', 'mono ellip', r.field), el('div', 'mono ellip' + (r.source ? '' : ' muted'), r.source || '—'),
      el('div', 'ops', ...ops.map((op) => el('span', 'chip', op))),
      dtypeShape(r.stored_dtype, r.stored_shape), dtypeShape(r.dtype, r.shape), status);
    row.setAttribute('data-field', String(r.field));
    row.children[0].setAttribute('title', String(r.field));
    if (r.source) row.children[1].setAttribute('title', String(r.source));
    if (ops.length) row.children[2].setAttribute('title', ops.join(' → '));
    if (r.problem != null) status.setAttribute('title', String(r.problem));
    return row;
  }

  function dtypeShape(dtype, shape) {
    if (dtype == null && shape == null) return el('div', 'dshape muted', '—');
    return el('div', 'dshape', dtype != null ? el('span', 'mono dt', dtype) : null, shape != null ? el('span', 'mono dim', ' ' + fmtShape(shape)) : null);
  }

  // ---------------------------------------------------------------- 7. memory

  function buildMemory(root) {
    const m = DATA.memory, kv = m.kv || [];
    const weights = m.weights_bytes || 0, kvBytes = kv.length ? kv[0].bytes || 0 : 0;
    const total = m.total_bytes || weights + kvBytes;
    const share = (b) => fmtPct(total ? b / total : 0);
    const box = add(root, el('div', 'memory')).lastChild;
    box.id = 'memory';
    const fact = (k, v) => el('div', 'fact', el('dt', null, k), el('dd', null, v == null ? '–' : v));
    add(box, el('dl', 'facts', fact('architecture', m.architecture), fact('source', m.source), fact('context (ctx)', fmtInt(m.ctx)),
      fact('batch', fmtInt(m.batch)), fact('layers', fmtInt(m.layers)), fact('kv heads', fmtInt(m.kv_heads)),
      fact('head dim', fmtInt(m.head_dim)), fact('trained context', m.context_length == null ? 'unknown' : fmtInt(m.context_length))));
    if (m.experts) {
      const e = m.experts;
      add(box, el('p', 'note', 'Mixture of experts: ' + fmtInt(e.per_token) + ' of ' + fmtInt(e.count) +
        ' experts a token. The expert stacks hold ' + fmtBytes(e.bytes) + ' of the weights; a token reads about ' +
        fmtBytes(e.bytes_per_token) + ' of them, and only the pages of the experts it is routed to become resident.'));
    }
    if (m.recurrent) {
      const r = m.recurrent;
      add(box, el('p', 'note', 'Hybrid: ' + fmtInt(r.layers) + ' of ' + fmtInt(m.layers) +
        ' layers are recurrent (Gated DeltaNet). They keep a state of ' + fmtBytes(r.bytes_per_sequence) +
        ' per sequence, whatever the context, instead of keys and values; the KV cache counts the ' +
        fmtInt(r.attention_layers) + ' attention layers.'));
    }
    if (m.context_length != null && m.ctx > m.context_length) {
      add(box, el('p', 'note warn', '! The context asked for (' + fmtInt(m.ctx) + ') exceeds what the model was trained on (' + fmtInt(m.context_length) + ').'));
    }

    // Weights against the first KV row, as one stacked bar.
    const bar = el('div', 'stack');
    const part = (cls, bytes, text) => {
      const s = add(bar, el('span', cls, total && bytes / total > 0.12 ? text + ' ' + fmtBytes(bytes) : null)).lastChild;
      s.style.flexGrow = String(Math.max(bytes, 0));
      s.setAttribute('title', text + ': ' + fmtBytes(bytes));
    };
    part('mem-weights', weights, 'weights');
    if (kv.length) part('mem-kv', kvBytes, 'KV cache (' + kv[0].dtype + ')');
    section(box, 'Estimate', 'total ' + fmtBytes(total));
    add(box, bar, el('div', 'stack-legend',
      el('span', null, el('span', 'swatch mem-weights'), 'weights ' + fmtBytes(weights) + ' (' + share(weights) + ')'),
      kv.length ? el('span', null, el('span', 'swatch mem-kv'), 'KV cache ' + fmtBytes(kvBytes) + ' (' + share(kvBytes) + ')') : null));

    const t = gridTable('', ['KV cache dtype', ['Bytes', 'num'], 'Note', ['With weights', 'num']]);
    for (const r of kv) {
      add(t.body, el('tr', null, el('td', 'mono', r.dtype), el('td', 'num', fmtBytes(r.bytes)), el('td', null, r.note),
        el('td', 'num', fmtBytes(weights + (r.bytes || 0)))));
    }
    add(t.body, el('tr', 'total', el('td', null, 'weights'), el('td', 'num', fmtBytes(weights)), el('td'), el('td')),
      el('tr', 'total', el('td', null, 'total'), el('td', 'num', fmtBytes(total)), el('td', 'muted', 'weights + first KV row'), el('td')));
    box.appendChild(t.table);
  }

  // ---------------------------------------------------------------- 8. metadata

  function buildMeta(root) {
    const meta = DATA.metadata || [];
    const wrap = add(root, el('div', 'metadata')).lastChild;
    wrap.id = 'metadata';
    const t = gridTable('meta-table', [['Key', 'k'], ['Type', 't'], 'Value']);
    for (const m of meta) add(t.body, el('tr', null, el('td', 'mono key', m.key), el('td', null, el('span', 'chip', m.type == null ? '?' : m.type)), metaValue(m)));
    if (!meta.length) add(t.body, el('tr', null, el('td', 'muted', 'no metadata'), el('td'), el('td')));
    wrap.appendChild(t.table);
    if (typeof DATA.chat_template === 'string') {
      section(wrap, 'Chat template', plural(DATA.chat_template.length, 'character'));
      add(wrap, el('pre', 'template', DATA.chat_template)).lastChild.id = 'chat-template';
    }
  }

  // Strings keep their line breaks; arrays list their (possibly cut) items as JSON.
  function metaValue(m) {
    const v = m.value;
    if (typeof v === 'string') return el('td', 'val', el('div', 'val-str', v));
    if (!Array.isArray(v)) return el('td', 'val', el('div', 'val-str mono', v !== null && typeof v === 'object' ? JSON.stringify(v, null, 1) : String(v)));
    const length = m.length != null ? m.length : v.length;
    return el('td', 'val', el('div', 'val-arr mono', v.map((x) => JSON.stringify(x)).join(', ')),
      m.folded || length > v.length ? el('div', 'muted small', '… and ' + fmtInt(length - v.length) + ' more (length ' + fmtInt(length) + ')') : null);
  }

  // ================================================================ start

  buildHeader();
  buildTabs();
  readHash();
  state.view = viewByName(state.view).name;
  showView(viewByName(state.view)); // synchronous first render of the view named in the hash

  document.body.dataset.tensors = String(TENSORS.length);
  document.body.dataset.renderMs = String(Math.round(performance.now() - T0));
  document.body.dataset.ready = '1';

  window.addEventListener('hashchange', () => {
    if (ignoreHashChange) { ignoreHashChange = false; return; }
    readHash();
    showView(viewByName(state.view));
  });
  window.addEventListener('resize', perFrame(() => {
    const v = viewByName(state.view);
    if (v.api && v.api.resize) v.api.resize();
  }));
})();
