// ferrymq console: draws each page from the JSON API and polls it (no build step, no library).
// Every figure shown comes from /api/...; rows carry data-* attributes naming what they show.
"use strict";

const POLL_MS = 1000;
const page = location.pathname.replace(/^\/+/, "").split("/")[0] || "cluster";
const params = new URLSearchParams(location.search);
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"];

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function fmt(value) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "number" && !Number.isInteger(value)) return value.toFixed(1);
  return String(value);
}

function num(value, attrs) { return h("td", Object.assign({ class: "num" }, attrs || {}), fmt(value)); }

function table(headers, rows) {
  return h("table", {}, h("thead", {}, h("tr", {}, headers.map((t) => h("th", {}, t)))),
    h("tbody", {}, rows));
}

async function api(path, body) {
  const init = body === undefined ? {} : {
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
  };
  const response = await fetch(path, init);
  const data = await response.json().catch(() => ({ error: "bad_response", message: response.statusText }));
  if (!response.ok) throw Object.assign(new Error(data.message || response.statusText), { data });
  return data;
}

function notice(kind, text) {
  const el = document.getElementById("notice");
  el.hidden = false;
  el.className = kind;
  el.dataset.kind = kind;
  el.textContent = text;
}

// The dialog says what the action will do: a sentence, and optionally one line per thing it changes.
function confirmThen(what, action) {
  const box = document.getElementById("confirm");
  const { text, detail } = typeof what === "string" ? { text: what, detail: [] } : what;
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-detail").replaceChildren(...detail);
  box.hidden = false;
  const close = () => { box.hidden = true; yes.onclick = null; no.onclick = null; };
  const yes = document.getElementById("confirm-yes");
  const no = document.getElementById("confirm-no");
  no.onclick = close;
  yes.onclick = async () => {
    close();
    try {
      const result = await action();
      notice("ok", "Done: " + JSON.stringify(result));
      await refresh();
    } catch (err) {
      notice("error", (err.data && err.data.error ? err.data.error + ": " : "") + err.message);
    }
  };
}

function form(id, fields, label, describe, run) {
  const inputs = fields.map((f) => f.options
    ? h("select", { name: f.name }, f.options.map((o) => h("option", { value: o }, o)))
    : h("input", { name: f.name, placeholder: f.placeholder || f.name, type: f.type || "text", value: f.value }));
  const el = h("form", { id }, h("strong", {}, label), inputs, h("button", { type: "submit" }, label));
  el.addEventListener("submit", async (event) => {
    event.preventDefault();
    const values = Object.fromEntries(new FormData(el).entries());
    const described = describe(values);  // a promise when it reads the cluster first
    confirmThen(described instanceof Promise ? await described : described, () => run(values));
  });
  return el;
}

// ------------------------------------------------------------------ charts (SVG, hand drawn)

function chart(title, history, unit) {
  const width = 640, height = 180, pad = 36;
  const times = history.wall_ms;
  const keys = Object.keys(history.values).slice(0, COLORS.length);
  const all = keys.flatMap((k) => history.values[k].filter((v) => v !== null));
  const top = Math.max(1, ...all);
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "chart");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  const text = (x, y, t) => {
    const el = document.createElementNS(svg.namespaceURI, "text");
    el.setAttribute("x", x); el.setAttribute("y", y); el.textContent = t;
    svg.append(el);
  };
  text(4, 12, fmt(top) + " " + unit);
  text(4, height - 4, "0");
  if (times.length > 1) {
    const t0 = times[0], span = Math.max(1, times[times.length - 1] - t0);
    text(width - 120, height - 4, Math.round(span / 1000) + " s shown");
    keys.forEach((key, i) => {
      const points = history.values[key].map((v, j) => v === null ? null
        : [pad + (times[j] - t0) / span * (width - pad - 8), height - 16 - v / top * (height - 32)]);
      const d = points.filter((p) => p).map((p, j) => (j ? "L" : "M") + p[0].toFixed(1) + "," + p[1].toFixed(1)).join(" ");
      const drawn = history.values[key].filter((v) => v !== null);
      const path = document.createElementNS(svg.namespaceURI, "path");
      path.setAttribute("d", d); path.setAttribute("fill", "none");
      path.setAttribute("data-key", key); path.setAttribute("data-points", drawn.length);
      if (drawn.length) path.setAttribute("data-latest", drawn[drawn.length - 1]);
      path.setAttribute("stroke", COLORS[i]); path.setAttribute("stroke-width", "2");
      svg.append(path);
    });
  }
  return h("div", { class: "chart-box", "data-chart": title },
    h("h2", {}, title),
    svg,
    h("div", { class: "legend" }, keys.map((k, i) => {
      const last = history.values[k].filter((v) => v !== null).pop();
      return h("span", { style: "color:" + COLORS[i], "data-key": k }, "■ " + k + ": " + fmt(last) + " " + unit);
    })));
}

// ------------------------------------------------------------------ pages

const pages = {};

pages.cluster = {
  forms() {
    return [form("elect-master", [{ name: "broker_name", placeholder: "broker-a" },
      { name: "broker_id", placeholder: "broker id (empty: controller picks)" }], "Elect master",
      (v) => `Elect a new master of ${v.broker_name}` + (v.broker_id ? ` (broker ${v.broker_id})` : "") + "?",
      (v) => api("/api/actions/elect-master", {
        broker_name: v.broker_name, broker_id: v.broker_id === "" ? null : Number(v.broker_id),
      }))];
  },
  async live() {
    const data = await api("/api/cluster");
    const out = [h("p", {}, data.controller_mode ? "Controller mode: masters and SyncStateSets are the controller's."
      : "Classic master/slave (no controllers).")];
    for (const g of data.groups) {
      out.push(h("h2", {}, `${g.broker_name} (${g.cluster})`));
      out.push(table(["", "master", "master epoch", "SyncStateSet", "SyncStateSet epoch"], [h("tr", {
        "data-group": g.broker_name, "data-master-id": g.master_broker_id, "data-master-address": g.master_address,
        "data-master-epoch": g.master_epoch, "data-sync-state-set": g.sync_state_set.join(","),
      }, h("td", {}, "group"), h("td", { class: "master-address" }, g.master_address === null ? "no master"
        : `${g.master_broker_id} @ ${g.master_address}`), num(g.master_epoch),
      h("td", {}, "{" + g.sync_state_set.join(", ") + "}"), num(g.sync_state_set_epoch))]));
      out.push(table(["broker id", "address", "role", "alive", "in sync", "max log offset", "confirm offset", "epoch"],
        g.replicas.map((r) => h("tr", {
          class: (r.role === "master" ? "master" : "") + (r.alive ? "" : " dead"),
          "data-replica": `${g.broker_name}/${r.broker_id}`, "data-role": r.role,
          "data-confirm-offset": r.confirm_offset,
        }, num(r.broker_id), h("td", {}, r.address), h("td", {}, r.role),
        h("td", {}, h("span", { class: "badge " + (r.alive ? "ok" : "bad") }, r.alive ? "alive" : "down")),
        h("td", {}, r.in_sync ? "yes" : "no"), num(r.max_log_offset), num(r.confirm_offset), num(r.master_epoch)))));
    }
    return out;
  },
};

pages.topics = {
  forms() {
    return [form("create-topic", [{ name: "topic" }, { name: "queues", type: "number", value: "4" }],
      "Create topic", (v) => `Create topic ${v.topic} with ${v.queues} queues on every group?`,
      (v) => api("/api/actions/create-topic", { topic: v.topic, queues: Number(v.queues) }))];
  },
  async live() {
    const history = await api("/api/history");
    const out = [chart("Messages stored per second", history.topic_rates, "msg/s")];
    const one = params.get("topic");
    if (one) {
      const t = await api("/api/topics/" + encodeURIComponent(one));
      out.push(h("h2", {}, `Topic ${t.topic}: ${fmt(t.rate)} msg/s`));
      out.push(table(["broker group", "queue", "min offset", "max offset", "messages", "last store"],
        t.queues.map((q) => h("tr", { "data-queue": `${q.broker_name}/${q.queue_id}`, "data-max-offset": q.max_offset },
          h("td", {}, q.broker_name), num(q.queue_id), num(q.min_offset), num(q.max_offset), num(q.messages),
          h("td", {}, q.last_update_timestamp ? new Date(q.last_update_timestamp).toLocaleTimeString() : "–")))));
      return out;
    }
    const data = await api("/api/topics");
    out.push(table(["topic", "queues", "messages", "msg/s"], data.topics.map((t) => h("tr", {
      "data-topic": t.topic, "data-messages": t.messages, "data-max-offset-total": t.max_offset_total,
    }, h("td", {}, h("a", { href: "/topics?topic=" + encodeURIComponent(t.topic) }, t.topic)),
    num(t.queues), num(t.messages), num(t.rate)))));
    return out;
  },
};

// What a reset will do, queue by queue: the committed offset now and the queue's earliest or latest
// offset it moves to (the bounds the reset itself reads).
async function resetPreview(v) {
  const text = `Move group ${v.group}'s offsets in ${v.topic} to the ${v.to}?`;
  let topic, group;
  try {
    [topic, group] = await Promise.all([api("/api/topics/" + encodeURIComponent(v.topic)),
      api("/api/groups/" + encodeURIComponent(v.group) + "?topic=" + encodeURIComponent(v.topic))]);
  } catch (err) {
    return { text, detail: [h("p", { class: "warn" }, "Cannot show the queues: " + err.message)] };
  }
  const committed = new Map(group.queues.map((q) => [`${q.broker_name}/${q.queue_id}`, q.consumer_offset]));
  let lagAfter = 0;
  const rows = topic.queues.map((q) => {
    const queue = `${q.broker_name}/${q.queue_id}`;
    const from = committed.has(queue) ? committed.get(queue) : null;
    const to = v.to === "latest" ? q.max_offset : q.min_offset;
    lagAfter += q.max_offset - to;
    return h("tr", { "data-reset-queue": queue, "data-from": from, "data-to": to },
      h("td", {}, queue), num(from), num(to));
  });
  return {
    text: `${text} Lag ${group.lag} → ${lagAfter}.`,
    detail: [table(["queue", "committed now", "moves to"], rows)],
  };
}

pages.groups = {
  forms() {
    return [form("reset-offsets", [{ name: "group", value: params.get("group") || "" }, { name: "topic" },
      { name: "to", options: ["earliest", "latest"] }], "Reset offsets", resetPreview,
      (v) => api("/api/actions/reset-offsets", { group: v.group, topic: v.topic, to: v.to }))];
  },
  async live() {
    const history = await api("/api/history");
    const out = [chart("Consumer lag (messages)", history.group_lag, "msgs"),
      chart("Messages consumed per second", history.group_rates, "msg/s")];
    const one = params.get("group");
    if (one) {
      const g = await api("/api/groups/" + encodeURIComponent(one));
      out.push(h("h2", { "data-group-lag": g.lag }, `Group ${g.group}: lag ${g.lag}, ${fmt(g.rate)} msg/s`));
      out.push(table(["topic", "broker group", "queue", "queue end", "committed", "lag"], g.queues.map((q) => h("tr", {
        "data-queue": `${q.topic}/${q.broker_name}/${q.queue_id}`, "data-lag": q.lag,
        "data-consumer-offset": q.consumer_offset, "data-broker-offset": q.broker_offset,
      }, h("td", {}, q.topic), h("td", {}, q.broker_name), num(q.queue_id), num(q.broker_offset),
      num(q.consumer_offset), num(q.lag)))));
      return out;
    }
    const data = await api("/api/groups");
    out.push(table(["group", "queues", "lag", "consumed", "msg/s"], data.groups.map((g) => h("tr", {
      "data-group": g.group, "data-lag": g.lag,
    }, h("td", {}, h("a", { href: "/groups?group=" + encodeURIComponent(g.group) }, g.group)),
    num(g.queues), num(g.lag), num(g.consumed_total), num(g.rate)))));
    return out;
  },
};

pages.controller = {
  async live() {
    const data = await api("/api/controller");
    if (!data.controller_mode) return [h("p", {}, "This cluster runs without controllers (classic master/slave).")];
    return [
      h("h2", {}, "Controller nodes"),
      table(["node", "address", "answering", "leader", "term", "applied index"], data.nodes.map((n) => h("tr", {
        "data-node": n.address, "data-leader": n.is_leader ? "yes" : "no",
      }, h("td", {}, n.controller_id || "?"), h("td", {}, n.address),
      h("td", {}, h("span", { class: "badge " + (n.answering ? "ok" : "bad") }, n.answering ? "yes" : "no")),
      h("td", {}, n.is_leader ? "leader" : (n.leader_id ? "follower of " + n.leader_id : "–")),
      num(n.term), num(n.applied_index)))),
      h("h2", {}, "Recent elections (seen by this console)"),
      data.elections.length ? table(["time", "group", "old master", "new master", "epoch"],
        data.elections.map((e) => h("tr", { "data-election": e.broker_name, "data-epoch": e.master_epoch },
          h("td", {}, new Date(e.wall_ms).toLocaleTimeString()), h("td", {}, e.broker_name),
          h("td", {}, `${fmt(e.old_master_id)} @ ${fmt(e.old_master_address)}`),
          h("td", {}, `${fmt(e.new_master_id)} @ ${fmt(e.new_master_address)}`), num(e.master_epoch))))
        : h("p", {}, "None since this console started."),
    ];
  },
};

pages.messages = {
  poll: false,
  forms() {
    const show = async (query) => {
      const data = await api("/api/messages?" + new URLSearchParams(query));
      const live = document.getElementById("live");
      live.replaceChildren(h("h2", {}, `${data.messages.length} message(s)`),
        table(["topic", "broker group/queue", "offset", "keys", "tags", "stored", "offset msg id", "body"],
          data.messages.map((m) => h("tr", { "data-message": m.offset_msg_id },
            h("td", { "data-field": "topic" }, m.topic),
            h("td", { "data-field": "queue" }, `${m.broker_name}/${m.queue_id}`),
            num(m.queue_offset, { "data-field": "offset" }),
            h("td", { "data-field": "keys" }, m.keys.join(" ")), h("td", { "data-field": "tags" }, m.tags || ""),
            h("td", {}, new Date(m.store_timestamp_ms).toLocaleString()),
            h("td", { "data-field": "id" }, m.offset_msg_id),
            h("td", { "data-field": "body" }, h("pre", {}, m.body))))));
    };
    const lookup = (id, fields, label, query) => {
      const el = h("form", { id }, h("strong", {}, label),
        fields.map((f) => h("input", { name: f.name, placeholder: f.placeholder || f.name })),
        h("button", { type: "submit" }, label));
      el.addEventListener("submit", async (event) => {
        event.preventDefault();
        try {
          await show(query(Object.fromEntries(new FormData(el).entries())));
          document.getElementById("notice").hidden = true;
        } catch (err) {
          notice("error", (err.data && err.data.error ? err.data.error + ": " : "") + err.message);
        }
      });
      return el;
    };
    return [
      lookup("by-id", [{ name: "id", placeholder: "offset message id" }], "Find by id", (v) => ({ id: v.id })),
      lookup("by-key", [{ name: "topic" }, { name: "key" }], "Find by key", (v) => ({ topic: v.topic, key: v.key })),
    ];
  },
  async live() { return null; },
};

pages.connectors = {
  async live() {
    const data = await api("/api/connectors");
    if (!data.configured) return [h("p", {}, "No Connect REST URL configured (ferry console --connect URL).")];
    return [h("p", {}, "Connect REST: " + data.url),
      data.connectors.length ? table(["connector", "type", "state", "worker", "tasks"], data.connectors.map((c) => h("tr", {
        "data-connector": c.name, "data-state": c.state,
      }, h("td", {}, c.name), h("td", {}, c.type || "–"), h("td", {}, h("span", { class: "badge " + (c.state === "RUNNING" ? "ok" : "") }, c.state)),
      h("td", {}, c.worker_id || "–"), h("td", {}, c.tasks.map((t) => `${t.id}: ${t.state}`).join(", ") || "none"))))
        : h("p", {}, "No connectors.")];
  },
};

// ------------------------------------------------------------------ polling

let busy = false;

async function refresh() {
  const current = pages[page] || pages.cluster;
  if (busy) return;
  busy = true;
  try {
    const content = await current.live();
    if (content !== null) document.getElementById("live").replaceChildren(...content);
    document.body.dataset.loaded = String(Date.now());
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (err) {
    notice("error", (err.data && err.data.error ? err.data.error + ": " : "") + err.message);
  } finally {
    busy = false;
  }
}

for (const link of document.querySelectorAll("#nav a")) {
  if (link.getAttribute("href") === "/" + page) link.classList.add("current");
}
const current = pages[page] || pages.cluster;
document.getElementById("forms").replaceChildren(...(current.forms ? current.forms() : []));
document.body.dataset.page = page;
refresh();
if (current.poll !== false) setInterval(refresh, POLL_MS);
