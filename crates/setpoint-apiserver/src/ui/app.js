// The live view: reads the Kubernetes API with the user's bearer token (LIST, then WATCH from
// the list's resourceVersion, LIST again on 410 Gone) and renders Deployments → ReplicaSets →
// Pods, nodes, a timeline of Events and decision records, the faults of `setpoint chaos` and
// each object's return to convergence (from its Events), and an object's `why` chain, all
// narrowed by an optional namespace filter. Rendering is batched into one animation frame,
// redraws only the sections whose data changed since the last frame, and touches only the DOM
// nodes whose text changed; each ReplicaSet shows its counts and its first PODS_SHOWN pods, so
// 10,000 pods are not 10,000 DOM rows.

const PODS_SHOWN = 5;
const TIMELINE_SHOWN = 50;
// The newest faults the chaos panel shows, and the objects it lists per fault.
const CHAOS_FAULTS_SHOWN = 20;
const CHAOS_OBJECTS_SHOWN = 20;
// Decision records the page keeps (the newest); the timeline shows at most TIMELINE_SHOWN.
const DECISIONS_KEPT = 500;
// Records asked for per request, and how long the server may hold a request open waiting for
// new ones (it caps both).
const DECISIONS_PAGE = 500;
const DECISIONS_WAIT_SECONDS = 25;
const TOKEN_KEY = "setpoint.ui.token";
const NAMESPACE_KEY = "setpoint.ui.namespace";

// --- the token --------------------------------------------------------------------------

function takeTokenFromFragment() {
  const params = new URLSearchParams(location.hash.slice(1));
  const token = params.get("token");
  if (token) {
    sessionStorage.setItem(TOKEN_KEY, token);
    // Out of the address bar and the history, so it is not copied or bookmarked by accident.
    history.replaceState(null, "", location.pathname + location.search);
  }
  return sessionStorage.getItem(TOKEN_KEY);
}

let token = null;

function headers() {
  return { Authorization: `Bearer ${token}`, Accept: "application/json" };
}

class HttpError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function getJSON(path) {
  const r = await fetch(path, { headers: headers(), cache: "no-store" });
  if (!r.ok) {
    let message = `${r.status} ${r.statusText}`;
    try {
      message = (await r.json()).message || message;
    } catch (_) { /* not a Status */ }
    throw new HttpError(r.status, message);
  }
  return r.json();
}

// --- LIST + WATCH -----------------------------------------------------------------------

const uidOf = (o) => o.metadata.uid;

// Keeps `objects` (uid → object) in step with the collection at `path`; `onChange` is called
// after every change: `("LIST")` after a list, `(type, object)` after a watch event, `()` when
// only the error changed.
class Informer {
  constructor(path, onChange) {
    this.path = path;
    this.onChange = onChange;
    this.objects = new Map();
    this.rv = "";
    this.synced = false;
    this.error = null;
  }

  async run() {
    for (;;) {
      try {
        if (!this.synced) await this.list();
        await this.watch();
      } catch (e) {
        this.error = e;
        this.onChange();
        if (e.status === 401 || e.status === 403) {
          if (e.status === 401) return needLogin(e.message);
          // Not allowed to see this kind: the view says so and keeps trying now and then,
          // in case RBAC changes.
          await sleep(10000);
        } else {
          if (e.status === 410) this.synced = false;
          await sleep(1000);
        }
      }
    }
  }

  async list() {
    const list = await getJSON(this.path);
    this.objects = new Map(list.items.map((o) => [uidOf(o), o]));
    this.rv = list.metadata.resourceVersion;
    this.synced = true;
    this.error = null;
    this.onChange("LIST");
  }

  async watch() {
    const sep = this.path.includes("?") ? "&" : "?";
    const url = `${this.path}${sep}watch=1&allowWatchBookmarks=true&resourceVersion=${encodeURIComponent(this.rv)}`;
    const r = await fetch(url, { headers: headers(), cache: "no-store" });
    if (!r.ok) throw new HttpError(r.status, `${r.status} ${r.statusText}`);
    // Watching again after a failure: the header stops reporting it now, not at the next
    // event (which, for nodes, may be many seconds away).
    if (this.error) {
      this.error = null;
      this.onChange();
    }
    const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffered = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return; // the server ended the watch: watch again from this.rv
      buffered += value;
      let nl;
      while ((nl = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, nl).trim();
        buffered = buffered.slice(nl + 1);
        if (line) this.apply(JSON.parse(line));
      }
    }
  }

  apply(event) {
    const o = event.object;
    switch (event.type) {
      case "ADDED":
      case "MODIFIED":
        this.objects.set(uidOf(o), o);
        break;
      case "DELETED":
        this.objects.delete(uidOf(o));
        break;
      case "BOOKMARK":
        break;
      case "ERROR":
        // A Status: 410 Gone means this resourceVersion is compacted away — list again.
        throw new HttpError(o.code || 500, o.message || "watch error");
      default:
        return;
    }
    if (o.metadata && o.metadata.resourceVersion) this.rv = o.metadata.resourceVersion;
    this.error = null;
    this.onChange(event.type, o);
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Keeps the newest DECISIONS_KEPT decision records, following the server's
// `/debug/setpoint/decisions` cursor (docs/why.md): the newest page first, then every record
// after the cursor, each request held open by the server until there is one.
class DecisionFeed {
  constructor(onChange) {
    this.onChange = onChange;
    this.records = [];
    this.next = null;
    this.synced = false;
    this.error = null;
    // The server has no decision records (another distribution, or records turned off).
    this.unavailable = null;
  }

  async run() {
    for (;;) {
      try {
        const q = this.next === null
          ? `limit=${DECISIONS_PAGE}`
          : `since=${this.next}&limit=${DECISIONS_PAGE}&timeoutSeconds=${DECISIONS_WAIT_SECONDS}`;
        const page = await getJSON(`/debug/setpoint/decisions?${q}`);
        this.next = page.next;
        this.synced = true;
        this.error = null;
        if (page.records.length) {
          this.records.push(...page.records);
          if (this.records.length > DECISIONS_KEPT) {
            this.records.splice(0, this.records.length - DECISIONS_KEPT);
          }
        }
        this.onChange();
      } catch (e) {
        if (e.status === 401) return needLogin(e.message);
        if (e.status === 404 || e.status === 400) {
          // Not served here, or turned off: the timeline shows Events only.
          this.unavailable = e.message;
          this.synced = true;
          this.onChange();
          return;
        }
        this.error = e;
        this.onChange();
        await sleep(e.status === 403 ? 10000 : 1000);
      }
    }
  }
}

// --- rendering --------------------------------------------------------------------------

// The sections whose data changed since the last frame: only they are drawn again.
const dirty = new Set();
let scheduled = false;
function schedule(...sections) {
  for (const s of sections) dirty.add(s);
  if (scheduled) return;
  scheduled = true;
  requestAnimationFrame(() => {
    scheduled = false;
    render();
  });
}

const informers = {
  deployments: new Informer("/apis/apps/v1/deployments", () => schedule("deployments")),
  replicasets: new Informer("/apis/apps/v1/replicasets", () => schedule("deployments")),
  pods: new Informer("/api/v1/pods", () => schedule("deployments", "nodes")),
  nodes: new Informer("/api/v1/nodes", () => schedule("nodes")),
  events: new Informer("/api/v1/events", (type, e) => {
    schedule("timeline");
    noteChaosEvent(type, e);
  }),
  namespaces: new Informer("/api/v1/namespaces", () => schedule("namespaces")),
};
const decisions = new DecisionFeed(() => schedule("timeline"));

// The namespace filter: "" shows every namespace.
let namespace = sessionStorage.getItem(NAMESPACE_KEY) || "";
const shown = (ns) => !namespace || ns === namespace;

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// Writes only when the text differs, so unchanged rows cost no layout.
function setText(e, text) {
  if (e.textContent !== text) e.textContent = text;
}

function setClass(e, cls) {
  if (e.className !== cls) e.className = cls;
}

const controllerOf = (o) =>
  (o.metadata.ownerReferences || []).find((r) => r.controller);

// Groups `objects` by their controller's uid.
function byOwner(objects) {
  const groups = new Map();
  for (const o of objects) {
    const owner = controllerOf(o);
    if (!owner) continue;
    let g = groups.get(owner.uid);
    if (!g) groups.set(owner.uid, (g = []));
    g.push(o);
  }
  return groups;
}

const podReady = (p) =>
  (p.status?.conditions || []).some((c) => c.type === "Ready" && c.status === "True");
const key = (o) => `${o.metadata.namespace}/${o.metadata.name}`;
const byName = (a, b) => key(a).localeCompare(key(b));

// uid → the DOM of a Deployment or ReplicaSet, reused between frames.
const deploymentViews = new Map();
const replicaSetViews = new Map();

function deploymentView(d) {
  let v = deploymentViews.get(uidOf(d));
  if (!v) {
    const root = el("div", "deployment");
    root.dataset.deployment = key(d);
    const head = el("div", "head");
    const name = el("span", "name", key(d));
    const counts = el("span", "counts");
    const detail = el("span", "muted");
    head.append(name, counts, detail);
    head.addEventListener("click", () => why("deployments", d.metadata.namespace, d.metadata.name));
    const sets = el("div", "sets");
    root.append(head, sets);
    v = { root, counts, detail, sets };
    deploymentViews.set(uidOf(d), v);
  }
  return v;
}

function replicaSetView(rs) {
  let v = replicaSetViews.get(uidOf(rs));
  if (!v) {
    const root = el("div", "rs");
    root.dataset.replicaset = key(rs);
    const head = el("div", "head");
    const name = el("span", "name", rs.metadata.name);
    const counts = el("span", "counts");
    head.append(name, counts);
    head.addEventListener("click", () => why("replicasets", rs.metadata.namespace, rs.metadata.name));
    const pods = el("ul", "pods");
    root.append(head, pods);
    v = { root, counts, pods };
    replicaSetViews.set(uidOf(rs), v);
  }
  return v;
}

// Keeps `parent`'s children equal to `children`, in order, moving only what moved.
function reconcileChildren(parent, children) {
  let at = parent.firstChild;
  for (const c of children) {
    if (c !== at) parent.insertBefore(c, at);
    else at = at.nextSibling;
  }
  while (at) {
    const next = at.nextSibling;
    parent.removeChild(at);
    at = next;
  }
}

function renderPods(list, pods) {
  const shown = pods.slice(0, PODS_SHOWN);
  while (list.children.length > shown.length + (pods.length > PODS_SHOWN ? 1 : 0)) {
    list.lastChild.remove();
  }
  shown.forEach((p, i) => {
    let li = list.children[i];
    if (!li || li.dataset.more) {
      li = el("li");
      li.append(el("span", "name"), el("span"), el("span", "muted"));
      li.addEventListener("click", () => why("pods", li.dataset.namespace, li.dataset.name));
      list.insertBefore(li, list.children[i] || null);
    }
    li.dataset.namespace = p.metadata.namespace;
    li.dataset.name = p.metadata.name;
    const phase = p.metadata.deletionTimestamp ? "Terminating" : p.status?.phase || "Pending";
    setText(li.children[0], p.metadata.name);
    setText(li.children[1], phase + (podReady(p) ? " · ready" : ""));
    setClass(li.children[1], `phase-${phase}`);
    setText(li.children[2], p.spec?.nodeName || "unscheduled");
  });
  if (pods.length > PODS_SHOWN) {
    let more = list.children[shown.length];
    if (!more) {
      more = el("li", "muted");
      more.dataset.more = "1";
      list.append(more);
    }
    setText(more, `… and ${pods.length - PODS_SHOWN} more`);
  }
}

// The objects of `informer` in the namespace the filter shows.
function* inNamespace(informer) {
  for (const o of informer.objects.values()) if (shown(o.metadata.namespace)) yield o;
}

function renderDeployments() {
  const rsByDeployment = byOwner(inNamespace(informers.replicasets));
  let podsShown = 0;
  const podsByRs = byOwner((function* () {
    for (const p of inNamespace(informers.pods)) {
      podsShown += 1;
      yield p;
    }
  })());
  const deployments = [...inNamespace(informers.deployments)].sort(byName);
  const container = document.getElementById("deployments");
  const roots = [];
  const live = new Set();
  let desiredTotal = 0;
  let readyTotal = 0;
  for (const d of deployments) {
    live.add(uidOf(d));
    const v = deploymentView(d);
    const desired = d.spec?.replicas ?? 1;
    const sets = (rsByDeployment.get(uidOf(d)) || []).sort(byName);
    let pods = 0;
    let ready = 0;
    const rsRoots = [];
    for (const rs of sets) {
      live.add(uidOf(rs));
      const rv = replicaSetView(rs);
      const rsPods = (podsByRs.get(uidOf(rs)) || []).sort(byName);
      const rsReady = rsPods.filter(podReady).length;
      pods += rsPods.length;
      ready += rsReady;
      setText(rv.counts, `desired ${rs.spec?.replicas ?? 1} · pods ${rsPods.length} · ready ${rsReady}`);
      renderPods(rv.pods, rsPods);
      rsRoots.push(rv.root);
    }
    reconcileChildren(v.sets, rsRoots);
    desiredTotal += desired;
    readyTotal += ready;
    setText(v.counts, `desired ${desired} · pods ${pods} · ready ${ready}`);
    setClass(v.counts, ready === desired && pods === desired ? "counts done" : "counts behind");
    const st = d.status || {};
    setText(v.detail, `updated ${st.updatedReplicas ?? 0} · available ${st.availableReplicas ?? 0}`);
    roots.push(v.root);
  }
  for (const views of [deploymentViews, replicaSetViews]) {
    for (const uid of views.keys()) if (!live.has(uid)) views.delete(uid);
  }
  reconcileChildren(container, roots);
  document.getElementById("no-deployments").hidden = deployments.length > 0;
  setText(
    document.getElementById("totals"),
    `${deployments.length} Deployments · ${readyTotal}/${desiredTotal} ready · ${podsShown} pods ${namespace ? `in ${namespace}` : "in all"}`,
  );
}

function renderNodes() {
  const perNode = new Map();
  for (const p of inNamespace(informers.pods)) {
    const n = p.spec?.nodeName;
    if (!n) continue;
    let c = perNode.get(n);
    if (!c) perNode.set(n, (c = { pods: 0, running: 0, pending: 0 }));
    c.pods += 1;
    if (p.status?.phase === "Running") c.running += 1;
    if (p.status?.phase === "Pending") c.pending += 1;
  }
  const tbody = document.querySelector("#nodes tbody");
  const nodes = [...informers.nodes.objects.values()].sort(byName);
  while (tbody.children.length > nodes.length) tbody.lastChild.remove();
  nodes.forEach((n, i) => {
    let tr = tbody.children[i];
    if (!tr) {
      tr = el("tr");
      for (let k = 0; k < 5; k++) tr.append(el("td"));
      tbody.append(tr);
    }
    const ready = (n.status?.conditions || []).find((c) => c.type === "Ready");
    const c = perNode.get(n.metadata.name) || { pods: 0, running: 0, pending: 0 };
    tr.dataset.node = n.metadata.name;
    setText(tr.children[0], n.metadata.name);
    setText(tr.children[1], ready ? ready.status : "Unknown");
    setText(tr.children[2], String(c.pods));
    setText(tr.children[3], String(c.running));
    setText(tr.children[4], String(c.pending));
  });
}

const eventTime = (e) =>
  e.lastTimestamp || e.eventTime || e.firstTimestamp || e.metadata.creationTimestamp || "";

// An Event as a timeline entry. Parsed once per version of the Event (a watch event brings a
// new object), not once per frame.
const eventEntries = new WeakMap();
function eventEntry(e) {
  let entry = eventEntries.get(e);
  if (!entry) {
    const o = e.involvedObject || {};
    const count = e.count > 1 ? ` (×${e.count})` : "";
    const time = eventTime(e);
    entry = {
      ms: Date.parse(time) || 0,
      namespace: o.namespace || e.metadata.namespace || "",
      cls: `event ${e.type || ""}`,
      text: `${time} ${e.type} ${e.reason} ${(o.kind || "").toLowerCase()}/${o.name}: ${e.message}${count}`,
    };
    eventEntries.set(e, entry);
  }
  return entry;
}

// A decision record as a timeline entry: who decided about what, what it did (or saw, when it
// did nothing) and how the reconcile ended.
const decisionEntries = new WeakMap();
function decisionEntry(d) {
  let entry = decisionEntries.get(d);
  if (!entry) {
    const ms = Math.floor((d.endMicros || d.startMicros || 0) / 1000);
    const o = d.object || {};
    const what = (d.actions || []).length
      ? d.actions.map((a) => `${a.action} (rule: ${a.rule})`).join("; ")
      : (d.observed || []).join("; ") || "no action";
    const object = `${(o.kind || "").toLowerCase()}/${o.name}`;
    entry = {
      ms,
      namespace: o.namespace || "",
      cls: "decision",
      text: `${new Date(ms).toISOString()} decision ${d.controller} ${object}: ${what} → ${d.result}`,
    };
    decisionEntries.set(d, entry);
  }
  return entry;
}

// The newest `n` of `entries` in the namespace shown, newest first: one pass that keeps a
// small sorted window, not a sort of every Event.
function newest(entries, n) {
  const top = [];
  for (const e of entries) {
    if (!shown(e.namespace)) continue;
    if (top.length === n && e.ms <= top[n - 1].ms) continue;
    let i = top.length;
    while (i > 0 && top[i - 1].ms < e.ms) i -= 1;
    top.splice(i, 0, e);
    if (top.length > n) top.pop();
  }
  return top;
}

function renderTimeline() {
  const entries = newest(
    (function* () {
      for (const e of informers.events.objects.values()) yield eventEntry(e);
      for (const d of decisions.records) yield decisionEntry(d);
    })(),
    TIMELINE_SHOWN,
  );
  const list = document.getElementById("timeline");
  while (list.children.length > entries.length) list.lastChild.remove();
  entries.forEach((e, i) => {
    let li = list.children[i];
    if (!li) list.append((li = el("li")));
    setText(li, e.text);
    setClass(li, e.cls);
    if (li.dataset.namespace !== e.namespace) li.dataset.namespace = e.namespace;
  });
  setText(
    document.getElementById("timeline-note"),
    decisions.unavailable ? `decision records are not available: ${decisions.unavailable}` : "",
  );
}

// --- chaos ------------------------------------------------------------------------------

// `setpoint chaos` writes its Events as this component, annotated with the fault they are
// about (crates/setpoint/src/chaos/events.rs, docs/chaos.md).
const CHAOS_COMPONENT = "setpoint-chaos";
const CHAOS = "setpoint.io/chaos-";

// Events of `setpoint chaos` without the annotations (older versions) are left out: their
// messages name the fault's type but not which of several faults of that type they are about.
const isChaosEvent = (e) =>
  (e.source?.component === CHAOS_COMPONENT || e.reportingComponent === CHAOS_COMPONENT) &&
  !!e.metadata?.annotations?.[`${CHAOS}fault-index`];

// The events informer's chaos Events (uid → Event), kept as it changes: the panel then reads
// only them, and is drawn again only when one of them changed, however many other Events the
// cluster has.
const chaosEvents = new Map();
function noteChaosEvent(type, e) {
  if (type === "LIST") {
    chaosEvents.clear();
    for (const [uid, o] of informers.events.objects) if (isChaosEvent(o)) chaosEvents.set(uid, o);
    schedule("chaos");
  } else if (e?.metadata?.uid) {
    const uid = uidOf(e);
    if (type !== "DELETED" && isChaosEvent(e)) {
      chaosEvents.set(uid, e);
      schedule("chaos");
    } else if (chaosEvents.delete(uid)) {
      schedule("chaos");
    }
  }
}

// The chaos Events in the namespace shown, grouped by fault (schedule seed and fault number),
// newest fault first, the newest CHAOS_FAULTS_SHOWN.
function chaosFaults() {
  const faults = new Map();
  for (const e of chaosEvents.values()) {
    const o = e.involvedObject || {};
    if (!shown(o.namespace || e.metadata.namespace || "")) continue;
    const a = e.metadata.annotations;
    const seed = a[`${CHAOS}seed`] || "";
    const index = Number(a[`${CHAOS}fault-index`]) || 0;
    const id = `${seed}/${index}`;
    let f = faults.get(id);
    if (!f) {
      f = { id, seed, index, label: a[`${CHAOS}fault`] || "", process: "", injected: "" };
      Object.assign(f, { ms: Infinity, converged: null, notConverged: null, objects: [] });
      faults.set(id, f);
    }
    const time = eventTime(e);
    const ms = Date.parse(time) || 0;
    // Ordered by injection; until that Event is seen, by the fault's earliest Event.
    if (!f.injected && ms < f.ms) f.ms = ms;
    const after = Number(a[`${CHAOS}converged-ms`]);
    if (e.reason === "FaultInjected") {
      f.process = a[`${CHAOS}process`] || "";
      f.injected = time;
      f.ms = ms;
    } else if (e.reason === "Converged" && o.kind === "Namespace") {
      f.converged = after;
    } else if (e.reason === "Converged") {
      f.objects.push({
        kind: o.kind || "",
        namespace: o.namespace || "",
        name: o.name || "",
        after,
      });
    } else if (e.reason === "NotConverged") {
      f.notConverged = e.message || "";
    }
  }
  return [...faults.values()]
    .sort((x, y) => y.ms - x.ms || y.index - x.index)
    .slice(0, CHAOS_FAULTS_SHOWN);
}

const seconds = (ms) => (Number.isFinite(ms) ? `${(ms / 1000).toFixed(2)} s` : "?");

// A fault's view: its label, process, time, outcome and its objects' times, slowest first.
// Drawn only when a chaos Event or the namespace filter changed, so it is built anew each time.
function chaosFaultView(f) {
  const root = el("div", "fault");
  root.dataset.fault = f.id;
  const head = el("div", "head");
  head.append(
    el("span", "label", f.label),
    el("span", "muted", `#${f.index} of seed ${f.seed}`),
    el("span", "process", f.process ? `on ${f.process}` : ""),
    el("span", "muted", f.injected ? `injected ${f.injected}` : ""),
  );
  let outcome;
  if (f.converged !== null) {
    outcome = el("span", "outcome converged", `converged ${seconds(f.converged)} after recovery`);
  } else if (f.notConverged !== null) {
    outcome = el("span", "outcome not-converged", f.notConverged);
  } else {
    outcome = el("span", "outcome converging", "converging…");
  }
  head.append(outcome);
  root.append(head);
  const objects = f.objects.sort(
    (x, y) => (y.after || 0) - (x.after || 0) || x.name.localeCompare(y.name),
  );
  if (objects.length) {
    const table = el("table", "objects");
    const thead = el("thead");
    const tr = el("tr");
    tr.append(el("th", "", "Object"), el("th", "", "Converged after recovery"));
    thead.append(tr);
    const tbody = el("tbody");
    for (const o of objects.slice(0, CHAOS_OBJECTS_SHOWN)) {
      const row = el("tr");
      row.dataset.object = `${o.kind}/${o.namespace}/${o.name}`;
      row.append(
        el("td", "", `${o.kind.toLowerCase()} ${o.namespace}/${o.name}`),
        el("td", "", seconds(o.after)),
      );
      row.addEventListener("click", () => why(o.kind.toLowerCase(), o.namespace, o.name));
      tbody.append(row);
    }
    table.append(thead, tbody);
    root.append(table);
    if (objects.length > CHAOS_OBJECTS_SHOWN) {
      root.append(el("p", "muted", `… and ${objects.length - CHAOS_OBJECTS_SHOWN} more`));
    }
  } else if (f.converged !== null) {
    root.append(el("p", "muted", "No object was seen out of convergence."));
  }
  return root;
}

function renderChaos() {
  const faults = chaosFaults();
  document.getElementById("chaos-section").hidden = faults.length === 0;
  document.getElementById("chaos").replaceChildren(...faults.map(chaosFaultView));
}

// The filter's choices: every namespace listed, and the one chosen even before it is listed.
function renderNamespaces() {
  const select = document.getElementById("namespace");
  const names = [...informers.namespaces.objects.values()].map((n) => n.metadata.name);
  if (namespace && !names.includes(namespace)) names.push(namespace);
  names.sort();
  const want = ["", ...names];
  while (select.options.length > want.length) select.lastChild.remove();
  want.forEach((name, i) => {
    let option = select.options[i];
    if (!option) select.append((option = el("option")));
    option.value = name;
    setText(option, name || "all namespaces");
  });
  select.value = namespace;
}

function renderStatus() {
  const status = document.getElementById("status");
  const sources = [...Object.entries(informers), ["decisions", decisions]];
  const failing = sources.filter(([, i]) => i.error);
  const syncing = sources.filter(([, i]) => !i.synced);
  if (failing.length) {
    status.dataset.state = "error";
    setText(status, failing.map(([n, i]) => `${n}: ${i.error.message}`).join("; "));
  } else if (syncing.length) {
    status.dataset.state = "starting";
    setText(status, `listing ${syncing.map(([n]) => n).join(", ")}…`);
  } else {
    status.dataset.state = "live";
    setText(status, "live");
  }
}

let firstSync = true;

function render() {
  const begun = performance.now();
  renderStatus();
  if (dirty.has("namespaces")) renderNamespaces();
  if (dirty.has("deployments")) renderDeployments();
  if (dirty.has("nodes")) renderNodes();
  if (dirty.has("timeline")) renderTimeline();
  if (dirty.has("chaos")) renderChaos();
  dirty.clear();
  // The time to the first complete picture, and what its render cost, for the browser's
  // performance tools (docs/ui.md quotes them for 10,000 pods).
  if (firstSync && Object.values(informers).every((i) => i.synced)) {
    firstSync = false;
    performance.measure("setpoint:first-synced-render", { start: begun, end: performance.now() });
    performance.mark("setpoint:synced");
  }
}

// --- why --------------------------------------------------------------------------------

async function why(type, namespace, name) {
  const out = document.getElementById("why");
  out.className = "muted";
  out.textContent = `asking why ${type} ${namespace}/${name}…`;
  const q = new URLSearchParams({ type, namespace: namespace || "", name });
  try {
    // The server renders the chain as `kubectl why` prints it.
    const r = await fetch(`/debug/setpoint/why?${q}`, {
      headers: { ...headers(), Accept: "text/plain" },
      cache: "no-store",
    });
    const text = await r.text();
    if (!r.ok) {
      let message = `${r.status} ${r.statusText}`;
      try {
        message = JSON.parse(text).message || message;
      } catch (_) { /* not a Status */ }
      throw new HttpError(r.status, message);
    }
    out.className = "";
    out.textContent = text;
  } catch (e) {
    out.className = "error";
    out.textContent =
      e.status === 404
        ? "The why chain is not available from this server."
        : `why ${type} ${namespace}/${name}: ${e.message}`;
  }
}

// --- start ------------------------------------------------------------------------------

function needLogin(message) {
  document.getElementById("main").hidden = true;
  document.getElementById("logout").hidden = true;
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = message || "";
}

function start() {
  document.getElementById("login-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const t = document.getElementById("login-token").value.trim();
    if (!t) return;
    sessionStorage.setItem(TOKEN_KEY, t);
    location.reload();
  });
  document.getElementById("logout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    location.reload();
  });
  document.getElementById("namespace").addEventListener("change", (ev) => {
    namespace = ev.target.value;
    sessionStorage.setItem(NAMESPACE_KEY, namespace);
    schedule("namespaces", "deployments", "nodes", "timeline", "chaos");
  });
  token = takeTokenFromFragment();
  if (!token) return needLogin("");
  document.getElementById("main").hidden = false;
  document.getElementById("logout").hidden = false;
  schedule("namespaces", "deployments", "nodes", "timeline", "chaos");
  for (const informer of Object.values(informers)) informer.run();
  decisions.run();
}

start();
