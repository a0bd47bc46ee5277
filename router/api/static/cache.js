// The cache page: polls /cache/tree and /cache_info, draws the tree as an icicle (width: the
// tokens cached in a subtree), the KV pool's use, and the hit rate and evictions over time.
// Served by a gateway, it draws the replica chosen in its selector (?replica= on both calls).
"use strict";

const POLL_MS = 1000;
const ROW_PX = 24;
const SERIES_POINTS = 120;
const $ = (id) => document.getElementById(id);
const history = { hit: [], evicted: [] };
let last = null; // the previous /cache_info, for the per-poll deltas
let replicas = null; // a gateway's replicas (GET /replicas); [] on a replica, null until known

// the key: from the page's fragment (#key=..., never sent to the server) or the field
function apiKey() {
  const fromHash = new URLSearchParams(location.hash.slice(1)).get("key");
  if (fromHash && !$("key").value) $("key").value = fromHash;
  return $("key").value;
}

async function getJson(path) {
  const key = apiKey();
  const resp = await fetch(path, { headers: key ? { Authorization: "Bearer " + key } : {} });
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) throw Object.assign(new Error(body.error ? body.error.message : resp.statusText), { status: resp.status });
  return body;
}

// a gateway lists its replicas; a replica has no /replicas (404): no selector
async function listReplicas() {
  try {
    return (await getJson("/replicas")).replicas;
  } catch (err) {
    if (err.status === 404) return [];
    throw err;
  }
}

function fillReplicas(list) {
  const select = $("replica");
  select.replaceChildren(
    ...list.map((replica, i) => {
      const option = document.createElement("option");
      option.value = String(i);
      option.textContent = replica.url;
      return option;
    }),
  );
  const first = list.findIndex((replica) => replica.available);
  if (first >= 0) select.value = String(first);
  $("replica-field").hidden = list.length === 0;
}

function percent(x) {
  return (100 * x).toFixed(1) + "%";
}

function colour(node, scale) {
  // hits: more is darker blue; recency: recently used is warmer
  if ($("colour").value === "age") {
    const fresh = 1 - Math.min(1, node.age / Math.max(1, scale.age));
    return `hsl(${200 - 170 * fresh}, 70%, ${80 - 30 * fresh}%)`;
  }
  const hot = Math.log1p(node.hits) / Math.log1p(Math.max(1, scale.hits));
  return `hsl(210, 65%, ${88 - 48 * hot}%)`;
}

function scaleOf(root) {
  const scale = { hits: 0, age: 0 };
  const walk = (n) => {
    scale.hits = Math.max(scale.hits, n.hits || 0);
    scale.age = Math.max(scale.age, n.age || 0);
    n.children.forEach(walk);
  };
  walk(root);
  return scale;
}

function block(container, node, x, width, level, total, scale) {
  const div = document.createElement("div");
  div.className = "node";
  div.style.left = (100 * x) / total + "%";
  div.style.width = (100 * width) / total + "%";
  div.style.top = level * ROW_PX + "px";
  div.style.height = ROW_PX + "px";
  div.dataset.id = node.id;
  div.dataset.tokens = node.tokens;
  div.dataset.subtree = node.subtree_tokens;
  div.dataset.hits = node.hits || 0;
  if (node.id === "root") {
    div.classList.add("root");
    div.textContent = `root: ${node.subtree_tokens} tokens`;
  } else {
    div.style.background = colour(node, scale);
    div.classList.toggle("locked", node.locked);
    div.classList.toggle("pinned", node.pinned);
    div.dataset.locked = node.locked;
    div.dataset.pinned = node.pinned;
    const label = node.text !== undefined ? JSON.stringify(node.text) : node.id.slice(0, 8);
    div.textContent = `${label} · ${node.tokens}`;
    div.dataset.tip =
      `${label}\n${node.tokens} tokens here, ${node.subtree_tokens} below and here\n` +
      `hits ${node.hits}, last used ${node.age} ticks ago\n` +
      `${node.pinned ? "pinned" : node.locked ? "locked by a request" : "evictable"}` +
      (node.salt ? `\nsalt ${node.salt}` : "");
  }
  container.appendChild(div);
  return div;
}

function drawTree(snapshot) {
  const tree = $("tree");
  const root = snapshot.root;
  const total = Math.max(1, root.subtree_tokens);
  const scale = scaleOf(root);
  const frag = document.createDocumentFragment();
  let depth = 0;
  const place = (node, x, level) => {
    depth = Math.max(depth, level);
    block(frag, node, x, node.subtree_tokens, level, total, scale);
    let cx = x; // children sit under their parent's start; the rest of its width is its own run
    for (const child of node.children) {
      place(child, cx, level + 1);
      cx += child.subtree_tokens;
    }
    if (node.folded_tokens > 0) {
      const folded = block(frag, { id: "folded", tokens: node.folded_tokens, subtree_tokens: node.folded_tokens,
        hits: 0, age: 0, locked: false, pinned: false, children: [] }, cx, node.folded_tokens, level + 1, total, scale);
      folded.className = "node folded";
      folded.textContent = `${node.folded_tokens} folded`;
      folded.dataset.tip = `${node.folded_tokens} tokens in subtrees not drawn`;
    }
  };
  place(root, 0, 0);
  tree.replaceChildren(frag);
  tree.style.height = (depth + 2) * ROW_PX + "px";
  tree.dataset.nodes = snapshot.nodes;
  $("truncated").hidden = !snapshot.truncated;
}

function drawPool(info) {
  const total = info.num_pages * info.page_size;
  const used = total - info.free_pages * info.page_size;
  const parts = [
    ["pinned", info.pinned_tokens],
    ["locked", info.protected_tokens - info.pinned_tokens],
    ["evictable", info.evictable_tokens],
    ["private", Math.max(0, used - info.cached_tokens)],
    ["free", info.free_pages * info.page_size],
  ];
  $("pool").replaceChildren(
    ...parts.map(([name, tokens]) => {
      const div = document.createElement("div");
      div.className = name;
      div.style.background = "var(--c)";
      div.style.width = (100 * tokens) / Math.max(1, total) + "%";
      div.title = `${name}: ${tokens} tokens`;
      return div;
    }),
  );
  $("pool-size").textContent = `${total} tokens, ${percent(info.token_usage)} in use`;
}

function drawSeries(canvas, values, max, colourName) {
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  ctx.fillStyle = colourName;
  const w = canvas.width / SERIES_POINTS;
  values.forEach((v, i) => {
    const h = (canvas.height - 2) * (v / Math.max(max, 1e-9));
    ctx.fillRect(i * w, canvas.height - h, Math.max(1, w - 1), h);
  });
}

function record(info) {
  if (last !== null) {
    const prompt = info.prompt_tokens_total - last.prompt_tokens_total;
    const cached = info.cached_tokens_total - last.cached_tokens_total;
    history.hit.push(prompt > 0 ? cached / prompt : 0);
    history.evicted.push(Math.max(0, info.evicted_tokens_total - last.evicted_tokens_total));
    for (const series of Object.values(history)) if (series.length > SERIES_POINTS) series.shift();
  }
  last = info;
  drawSeries($("hit-series"), history.hit, 1, "#3b82c4");
  drawSeries($("evict-series"), history.evicted, Math.max(...history.evicted, 1), "#d9822b");
}

function drawSummary(info) {
  $("tree-nodes").textContent = info.tree_nodes;
  $("cached-tokens").textContent = info.cached_tokens;
  $("pinned-tokens").textContent = info.pinned_tokens;
  $("hit-rate").textContent = percent(info.hit_rate);
  $("token-hit-rate").textContent = percent(info.token_hit_rate);
  $("evicted").textContent = info.evicted_tokens_total;
  $("pins").tBodies[0].replaceChildren(
    ...info.pins.map((pin) => {
      const row = document.createElement("tr");
      for (const cell of [pin.id, pin.tokens, pin.prompt_tokens, pin.expires_in_s.toFixed(1) + " s"]) {
        const td = document.createElement("td");
        td.textContent = cell;
        row.appendChild(td);
      }
      return row;
    }),
  );
}

async function poll() {
  try {
    if (replicas === null) fillReplicas((replicas = await listReplicas()));
    const which = replicas.length ? "replica=" + $("replica").value : "";
    const query = `depth=${Number($("depth").value) || 8}&min_tokens=${Number($("min-tokens").value) || 0}`;
    const [snapshot, info] = await Promise.all([
      getJson("/cache/tree?" + query + (which && "&" + which)),
      getJson("/cache_info" + (which && "?" + which)),
    ]);
    drawTree(snapshot);
    drawPool(info);
    drawSummary(info);
    record(info);
    $("status").textContent = "live, " + new Date().toLocaleTimeString();
    $("status").className = "status ok";
  } catch (err) {
    $("status").textContent = String(err.message || err);
    $("status").className = "status error";
  }
  setTimeout(poll, POLL_MS);
}

$("tree").addEventListener("mousemove", (e) => {
  const tip = $("tip");
  const text = e.target.dataset ? e.target.dataset.tip : undefined;
  tip.hidden = !text;
  if (text) {
    tip.textContent = text;
    tip.style.left = e.clientX + 12 + "px";
    tip.style.top = e.clientY + 12 + "px";
  }
});
$("tree").addEventListener("mouseleave", () => ($("tip").hidden = true));
$("colour").addEventListener("change", () => ($("colour-name").textContent = $("colour").selectedOptions[0].text));
$("replica").addEventListener("change", () => (last = null)); // another replica: no deltas across
$("controls").addEventListener("submit", (e) => e.preventDefault());
poll();
