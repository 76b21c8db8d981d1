// specroute side by side: one prompt on every configured route through this gateway.
// The routes (names, speculation, order) come from /stats, never from this file:
// one column each, 2 to 4 or more. No framework, no build step, nothing loaded
// from elsewhere (the page's CSP allows this gateway only). Every text from a
// server goes in with textContent, never as HTML. The API key lives in `apiKey`
// and nowhere else.
"use strict";

(() => {
  const CHAT = "/v1/chat/completions";
  const REFRESH_MS = 10000;
  const COLORS = 6; // style.css: .side[data-color="0".."5"]
  let apiKey = null; // memory only: no storage, no cookie
  let running = false;
  let routes = []; // [{name, method, num_speculative_tokens}], the configuration's order
  let sides = {}; // route name -> Side
  // route name -> what its server's /version says of its emulation ({gpu_profile, gpu});
  // null: a real server; absent: not known yet
  let emulation = {};
  const TITLE = document.title;

  const $ = (id) => document.getElementById(id);

  // ---- presets: one per workload kind, plus a free prompt -------------------------

  const RECORD_SCHEMA = {
    type: "object",
    properties: {
      name: { type: "string" },
      topic: { type: "string" },
      priority: { type: "integer" },
      tags: { type: "array", items: { type: "string" } },
    },
    required: ["name", "topic", "priority", "tags"],
  };

  const CODE = Array.from({ length: 8 }, (_, i) =>
    `def total_orders_${i}(rows):\n    total = 0\n    for row in rows:\n` +
    `        total += row['amount']\n    return total\n`).join("\n");

  function longDocument() {
    const words = ("the system keeps a record of each request and its answer so that " +
      "later reviews can compare what was predicted with what was measured across many " +
      "regions and teams while the quarterly report lists revenue by product line and " +
      "notes where growth slowed").split(" ");
    let seed = 7;
    const out = [];
    for (let i = 0; i < 3000; i++) {
      seed = (seed * 1103515245 + 12345) % 2147483648;
      out.push(words[seed % words.length]);
    }
    return out.join(" ");
  }

  const PRESETS = [
    {
      id: "json", label: "JSON with a schema", temperature: 0, max_tokens: 96,
      prompt: "Extract a record from this note as JSON: Ada filed a note about invoices " +
        "with priority 3 and tags urgent, invoices.",
      response_format: { type: "json_schema", json_schema: { name: "record", schema: RECORD_SCHEMA } },
    },
    {
      id: "sql", label: "SQL", temperature: 0, max_tokens: 96,
      prompt: "Write a SQL query: SELECT the ten largest orders FROM the orders table " +
        "created after 2024-03-01, joined with customers, ordered by amount.",
    },
    {
      id: "code", label: "Code edit", temperature: 0, max_tokens: 160,
      prompt: "```python\n" + CODE + "```\nRename every function to snake case with a _v2 " +
        "suffix and return the whole file as code.",
    },
    {
      id: "poem", label: "Poem, temperature 1.2", temperature: 1.2, max_tokens: 128,
      prompt: "Write a poem about a lighthouse keeper who collects lost radio signals, " +
        "in a surprising style.",
    },
    {
      id: "long", label: "Long-context question", temperature: 0, max_tokens: 32,
      prompt: "Document:\n" + longDocument() +
        "\n\nQuestion: in one sentence, what does the report list?",
    },
    { id: "free", label: "Free prompt", temperature: 0.7, max_tokens: 256, prompt: "" },
  ];

  function applyPreset(preset) {
    $("prompt").value = preset.prompt;
    $("temperature").value = String(preset.temperature);
    $("max-tokens").value = String(preset.max_tokens);
    $("response-format").value = preset.response_format
      ? JSON.stringify(preset.response_format) : "";
    for (const b of document.querySelectorAll("#presets button")) {
      b.classList.toggle("chosen", b.dataset.preset === preset.id);
    }
    if (preset.id === "free") $("prompt").focus();
  }

  // ---- talking to the gateway ------------------------------------------------------

  function headers(extra) {
    const h = { "Content-Type": "application/json", ...extra };
    if (apiKey !== null) h.Authorization = "Bearer " + apiKey;
    return h;
  }

  class Refused extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  async function errorText(resp) {
    // The gateway's errors are OpenAI's {"error": {"message": ...}}; say what we got otherwise.
    const text = await resp.text();
    try {
      const msg = JSON.parse(text).error.message;
      if (typeof msg === "string" && msg) return msg;
    } catch (_) { /* not the gateway's shape */ }
    return text.trim().slice(0, 300) || resp.statusText || "no message";
  }

  async function api(path, init) {
    const resp = await fetch(path, { ...init, headers: headers(init && init.headers) });
    if (resp.status === 401) askForKey("the gateway refused this key");
    if (!resp.ok) throw new Refused(resp.status, await errorText(resp));
    return resp.json();
  }

  function askForKey(why) {
    const form = $("key-form");
    if (apiKey !== null) $("key-error").textContent = why;
    apiKey = null;
    form.hidden = false;
  }

  // ---- building the request --------------------------------------------------------

  function buildBody() {
    const body = { messages: [{ role: "user", content: $("prompt").value }] };
    const model = $("model").value;
    if (model) body.model = model;
    const temperature = $("temperature").value.trim();
    if (temperature !== "") body.temperature = Number(temperature);
    const maxTokens = $("max-tokens").value.trim();
    if (maxTokens !== "") body.max_tokens = Number(maxTokens);
    const format = $("response-format").value.trim();
    if (format !== "") {
      try {
        body.response_format = JSON.parse(format);
      } catch (e) {
        throw new Refused(0, "response_format is not valid JSON: " + e.message);
      }
    }
    return body;
  }

  // ---- one side: stream one route, measure it --------------------------------------

  const FIGURES = [
    ["ttft", "TTFT"], ["tps", "tok/s"], ["e2e", "e2e"], ["tokens", "output tokens"],
    ["acceptance", "acceptance"], ["length", "mean acceptance length"],
  ];

  // "ngram k=4", "eagle3 k=3", "none": what a route's server runs.
  function speculation(route) {
    return route.num_speculative_tokens > 0
      ? `${route.method} k=${route.num_speculative_tokens}` : "none";
  }

  function element(tag, className, text) {
    const el = document.createElement(tag);
    if (className) el.className = className;
    if (text !== undefined) el.textContent = text;
    return el;
  }

  class Side {
    constructor(route, index) {
      this.route = route.name;
      this.speculates = route.num_speculative_tokens > 0;
      this.result = null;
      const el = element("article", "side");
      el.id = "side-" + route.name;
      el.dataset.route = route.name;
      el.dataset.color = String(index % COLORS);
      el.dataset.state = "idle";
      const title = element("h2");
      const emulated = element("span", "emulated-tag", "EMULATED");
      emulated.hidden = true; // until its server's /version says so
      title.append(element("span", "name", route.name), element("span", "kind", speculation(route)),
        emulated, element("span", "state", "idle"));
      const badges = element("p", "badges");
      badges.append(element("span", "badge choice", "the gateway's choice"),
        element("span", "badge fastest", "fastest"));
      title.querySelector(".kind").hidden = speculation(route) === route.name; // "none" once
      el.append(title, badges, element("p", "predicted", "\u00a0"), element("dl", "figures"),
        element("p", "message"), element("pre", "output"));
      el.querySelector(".message").hidden = true;
      this.el = el;
    }

    // The dry run's figures for this route, under its name (empty: none).
    predict(text) {
      this.el.querySelector(".predicted").textContent = text || "\u00a0";
    }

    set(state, label) {
      this.el.dataset.state = state;
      this.el.querySelector(".state").textContent = label;
    }

    reset() {
      this.result = null;
      delete this.el.dataset.speedup;
      this.el.classList.remove("faster"); // "chosen" is the dry run's, set before the run
      this.el.querySelector(".output").textContent = "";
      this.say("");
      this.set("waiting", "waiting");
      this.figures({});
    }

    say(text) {
      const p = this.el.querySelector(".message");
      p.textContent = text;
      p.hidden = !text;
    }

    fail(state, message) {
      this.set(state, state === "down" ? "down" : "error");
      this.say(message);
      this.figures({});
      return null;
    }

    figures(r) {
      const dl = this.el.querySelector(".figures");
      dl.replaceChildren();
      for (const [key, label] of FIGURES) {
        const dt = document.createElement("dt");
        dt.textContent = label;
        const dd = document.createElement("dd");
        dd.dataset.figure = key;
        const [text, value, note] = this.shown(key, r);
        dd.textContent = text;
        if (value !== null) dd.dataset.value = String(value);
        if (note) {
          dd.classList.add("na");
          dd.title = note;
        }
        const pair = document.createElement("div");
        pair.append(dt, dd);
        dl.append(pair);
      }
    }

    shown(key, r) {
      if (r.e2e === undefined) return ["–", null, ""];
      const spec = r.spec;
      switch (key) {
        case "ttft": return r.ttft === null ? ["no token", null, ""] : [ms(r.ttft), r.ttft, ""];
        case "e2e": return [secs(r.e2e), r.e2e, ""];
        case "tokens": return r.tokens === null
          ? ["not reported", null, "the server sent no usage"] : [String(r.tokens), r.tokens, ""];
        case "tps": return r.tokens === null || r.e2e <= 0
          ? ["–", null, ""] : [(r.tokens / r.e2e).toFixed(0), r.tokens / r.e2e, ""];
        case "acceptance":
          if (!spec) return this.notReported();
          if (!spec.num_draft_tokens) return ["no drafts", null, "nothing was drafted"];
          return [`${spec.draft_acceptance_rate.toFixed(2)} (${spec.num_accepted_draft_tokens}` +
            ` of ${spec.num_draft_tokens} drafts)`, spec.draft_acceptance_rate, ""];
        case "length":
          if (!spec) return this.notReported();
          if (!spec.num_draft_tokens) return ["no drafts", null, "nothing was drafted"];
          return [`${spec.mean_acceptance_length.toFixed(2)} tokens/step`,
            spec.mean_acceptance_length, ""];
        default: return ["–", null, ""];
      }
    }

    notReported() {
      return !this.speculates
        ? ["not reported: no drafts", null, "this route's server does not speculate"]
        : ["not reported", null, "this server sends no per-request speculative metrics: " +
          "start vLLM with --per-request-spec-decode-metrics"];
    }

    async run(body) {
      this.reset();
      this.set("running", "running");
      const sent = { ...body, stream: true, stream_options: { include_usage: true } };
      const t0 = performance.now();
      let resp;
      try {
        resp = await fetch(CHAT, {
          method: "POST",
          // x-specroute-client: the gateway counts the page's runs apart (reason "ui")
          headers: headers({ "x-specroute-route": this.route, "x-specroute-client": "ui" }),
          body: JSON.stringify(sent),
        });
      } catch (e) {
        return this.fail("down", "the gateway did not answer: " + e.message);
      }
      if (resp.status === 401) askForKey("the gateway refused this key");
      if (!resp.ok) {
        const message = `${resp.status}: ${await errorText(resp)}`;
        return this.fail(resp.status >= 502 ? "down" : "error", message);
      }
      const answered = resp.headers.get("x-specroute-route");
      const failover = resp.headers.get("x-specroute-failover");
      if (failover || (answered && answered !== this.route)) {
        await resp.body.cancel(); // this side shows one route; the other's answer is not it
        return failover
          ? this.fail("down", `${this.route} is down: the gateway sent this request to ` +
            `${answered} instead (failover)`)
          : this.fail("error", `the gateway answered from ${answered}: it ignores the route ` +
            "header here (server.allow_route_override = false)");
      }
      return this.read(resp, t0);
    }

    async read(resp, t0) {
      const out = this.el.querySelector(".output");
      const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
      const r = { ttft: null, e2e: undefined, tokens: null, spec: null };
      let buffer = "";
      let done = false;
      let failed = null;
      while (!done) {
        let chunk;
        try {
          chunk = await reader.read();
        } catch (e) {
          failed = "the stream broke: " + e.message;
          break;
        }
        if (chunk.done) break;
        buffer += chunk.value.replace(/\r\n/g, "\n");
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const event = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          for (const line of event.split("\n")) {
            if (!line.startsWith("data:")) continue;
            const data = line.slice(5).trim();
            if (data === "[DONE]") {
              done = true;
              continue;
            }
            let obj;
            try {
              obj = JSON.parse(data);
            } catch (_) {
              continue;
            }
            if (obj.error) {
              failed = obj.error.message || "the backend failed mid-stream";
              continue;
            }
            const choice = (obj.choices || [])[0];
            const text = choice && ((choice.delta && choice.delta.content) || choice.text);
            if (text) {
              if (r.ttft === null) r.ttft = (performance.now() - t0) / 1000;
              out.append(text);
            }
            if (obj.usage) r.tokens = obj.usage.completion_tokens;
            const spec = obj.metrics && obj.metrics.speculative_decoding;
            if (spec) r.spec = spec;
          }
        }
      }
      r.e2e = (performance.now() - t0) / 1000;
      if (failed) return this.fail("error", failed);
      if (!done) return this.fail("error", "the stream ended without [DONE]");
      this.result = r;
      this.set("done", "done");
      this.figures(r);
      return r;
    }
  }

  // One column per route, rebuilt only when the configuration's routes change (a
  // reload may change them; a run in progress keeps its columns).
  function setRoutes(list) {
    if (!Array.isArray(list) || !list.length) return;
    const key = (rs) => JSON.stringify(rs.map((r) => [r.name, r.method, r.num_speculative_tokens]));
    if (key(list) === key(routes) || running) return;
    routes = list;
    sides = {};
    const box = $("sides");
    box.replaceChildren();
    box.dataset.count = String(list.length);
    list.forEach((r, i) => {
      const side = new Side(r, i);
      sides[r.name] = side;
      box.append(side.el);
      side.figures({});
    });
    $("run").disabled = false;
    $("routes-note").textContent = `${list.length} routes: ` +
      list.map((r) => (speculation(r) === r.name ? r.name : `${r.name} (${speculation(r)})`))
        .join(", ");
    checkEmulation(list);
  }

  // ---- EMULATED: said on every surface when the servers are the emulator's ----------

  // Each route's vLLM /version, through the gateway to that route: the emulator's
  // says "+emulated" and names the GPU profile its timing models.
  async function checkEmulation(list) {
    const found = {};
    await Promise.all(list.map(async (r) => {
      try {
        const v = await api("/version", { headers: { "x-specroute-route": r.name } });
        const marked = typeof v.version === "string" && v.version.includes("+emulated");
        found[r.name] = v.emulated || (marked ? {} : null);
      } catch (_) { /* not known: said neither way */ }
    }));
    emulation = found;
    showEmulation();
  }

  function showEmulation() {
    const names = routes.map((r) => r.name).filter((n) => emulation[n]);
    const on = names.length > 0;
    document.body.dataset.emulated = String(on);
    document.title = (on ? "EMULATED · " : "") + TITLE;
    for (const [name, side] of Object.entries(sides)) {
      const e = emulation[name];
      const tag = side.el.querySelector(".emulated-tag");
      tag.hidden = !e;
      tag.title = e ? `an emulated vLLM server: ${e.gpu || "GPU not said"}` : "";
    }
    const banner = $("emulated");
    banner.hidden = !on;
    if (!on) return;
    // The GPU as a route without a drafter describes it (its text names no drafter).
    const plain = names.find((n) => !sides[n] || !sides[n].speculates) || names[0];
    const profiles = [...new Set(names.map((n) => emulation[n].gpu_profile).filter(Boolean))];
    const who = names.length === routes.length ? "Every route's server is"
      : `${names.join(", ")} ${names.length > 1 ? "are" : "is"}`;
    banner.textContent = `EMULATED: ${who} an emulated vLLM server: no model runs and no ` +
      "GPU; every time on this page is modelled" +
      (emulation[plain].gpu ? `, on the ${emulation[plain].gpu}` : "") +
      (profiles.length > 1 ? ` (GPU profiles ${profiles.join(", ")})` : "") + ".";
  }

  // The route speedups are over: the first without speculation (null: all speculate).
  function reference() {
    const plain = routes.find((r) => !(r.num_speculative_tokens > 0));
    return plain ? plain.name : null;
  }

  function colorOf(name) {
    const i = routes.findIndex((r) => r.name === name);
    return i < 0 ? "" : String(i % COLORS);
  }

  // ---- the decision panel ----------------------------------------------------------

  function pairs(dl, rows) {
    dl.replaceChildren();
    for (const [label, value, key] of rows) {
      const dt = document.createElement("dt");
      dt.textContent = label;
      const dd = document.createElement("dd");
      dd.textContent = value;
      if (key) dd.dataset.key = key;
      const pair = document.createElement("div");
      pair.append(dt, dd);
      dl.append(pair);
    }
  }

  function showDecision(d) {
    setRoutes(d.routes);
    const panel = $("decision");
    panel.dataset.state = "decided";
    panel.dataset.route = d.route;
    panel.dataset.color = colorOf(d.route);
    panel.dataset.reason = d.reason;
    const chosen = routes.find((r) => r.name === d.route);
    $("decision-summary").textContent = `The gateway would send this to ${d.route}` +
      `${chosen ? ` (${speculation(chosen)})` : ""}: ${d.reason} (policy ${d.policy}).`;
    const p = d.predicted_s || {};
    const speedup = d.predicted_speedup || {};
    const why = d.why || {};
    const cost = why.cost_s || {};
    const steps = why.tokens_per_step || {};
    const spared = why.spared || {};
    $("speedup-head").textContent = d.speedup_over
      ? `predicted speedup over ${d.speedup_over}` : "predicted speedup";
    const body = $("prediction-table").querySelector("tbody");
    body.replaceChildren();
    for (const r of routes) {
      const a = (d.acceptance || {})[r.name];
      const tr = element("tr");
      tr.dataset.route = r.name;
      tr.dataset.color = colorOf(r.name);
      if (r.name === d.route) tr.className = "chosen";
      const notes = [];
      if (r.name === d.route) notes.push("chosen");
      if (spared[r.name]) notes.push(`spared: ${spared[r.name]}`);
      tr.append(
        cell(r.name, "name"), cell(speculation(r)),
        cell(p[r.name] === undefined ? "–" : secs(p[r.name]), "", "predicted"),
        cell(speedup[r.name] === undefined ? "–" : ratio(speedup[r.name]), "", "speedup"),
        cell(!a ? "no drafts" : a.rate === null ? "no estimate" : a.rate.toFixed(2),
          a ? "" : "na", "acceptance"),
        cell(steps[r.name] === undefined ? "–" : steps[r.name].toFixed(2)),
        cell(cost[r.name] === undefined ? "–" : secs(cost[r.name])),
        cell(notes.join("; "), "note"),
      );
      body.append(tr);
    }
    for (const [name, side] of Object.entries(sides)) {
      side.el.classList.toggle("chosen", name === d.route);
      const parts = [];
      if (p[name] !== undefined) parts.push(`predicted ${secs(p[name])}`);
      if (speedup[name] !== undefined && name !== d.speedup_over) {
        parts.push(`${ratio(speedup[name])} over ${d.speedup_over}`);
      }
      if (spared[name]) parts.push(`spared: ${spared[name]}`);
      side.predict(parts.join(" · "));
    }
    const rows = [["rule", why.rule === undefined ? "–" : String(why.rule), "rule"]];
    if (why.profile !== undefined) rows.push(["profile", String(why.profile), "profile"]);
    rows.push(["GPU group", String(d.pair), "pair"]);
    if (p[d.route] === undefined) {
      rows.push(["predicted", "– (this policy predicts no latencies)", "predicted"]);
    }
    pairs($("prediction"), rows);
    const f = d.features;
    pairs($("features"), [
      ["workload", f.workload], ["prompt tokens", String(f.prompt_tokens)],
      ["expected output tokens", String(f.expected_output_tokens)],
      ["temperature", String(f.temperature)], ["structured", String(f.structured)],
      ["code-like", String(f.code_like)],
    ]);
    $("decision-detail").hidden = false;
  }

  function decisionFailed(message) {
    const panel = $("decision");
    panel.dataset.state = "error";
    delete panel.dataset.route;
    delete panel.dataset.color;
    $("decision-summary").textContent = message;
    $("decision-detail").hidden = true;
    for (const side of Object.values(sides)) {
      side.predict("");
      side.el.classList.remove("chosen");
    }
  }

  function showVerdict(decision, mode) {
    const v = $("verdict");
    v.hidden = false;
    delete v.dataset.right;
    delete v.dataset.faster;
    delete v.dataset.measured;
    delete v.dataset.predicted;
    const all = Object.values(sides);
    const missing = all.filter((s) => !s.result).map((s) => s.route);
    if (missing.length) {
      v.textContent = `No comparison: ${missing.join(", ")} did not finish (see ` +
        `${missing.length > 1 ? "their messages" : "its message"}).`;
      return;
    }
    const fastest = all.reduce((a, b) => (b.result.e2e < a.result.e2e ? b : a));
    fastest.el.classList.add("faster");
    v.dataset.faster = fastest.route;
    const parts = [`Fastest: ${fastest.route}, ${secs(fastest.result.e2e)} e2e` +
      (all.length > 1 ? ` (${all.filter((s) => s !== fastest)
        .map((s) => `${s.route} ${secs(s.result.e2e)}`).join(", ")}).` : ".")];
    const over = reference();
    if (over && sides[over]) {
      const base = sides[over].result.e2e;
      const measured = {};
      for (const s of all) {
        measured[s.route] = base / s.result.e2e;
        s.el.dataset.speedup = String(measured[s.route]);
      }
      v.dataset.measured = JSON.stringify(measured);
      const others = all.filter((s) => s.route !== over);
      parts.push(`Measured speedup over ${over}: ` +
        others.map((s) => `${s.route} ${ratio(measured[s.route])}`).join(", ") + ".");
      const predicted = decision && decision.predicted_speedup;
      if (predicted) {
        v.dataset.predicted = JSON.stringify(predicted);
        parts.push("Predicted: " + others.filter((s) => predicted[s.route] !== undefined)
          .map((s) => `${s.route} ${ratio(predicted[s.route])}`).join(", ") + ".");
      }
    }
    if (decision) {
      v.dataset.right = String(decision.route === fastest.route);
      parts.push(decision.route === fastest.route
        ? `The gateway's choice, ${decision.route}, was the fastest.`
        : `The gateway would have chosen ${decision.route}, not the fastest here.`);
    }
    if (document.body.dataset.emulated === "true") {
      parts.unshift("EMULATED servers: modelled timing, not a GPU's.");
    }
    parts.push(mode === "together"
      ? "They ran at once: on one shared GPU each slowed the others, and the prediction " +
        "is for a request alone."
      : "They ran one after the other, each alone.");
    v.textContent = parts.join(" ");
  }

  // ---- live figures ----------------------------------------------------------------

  function cell(text, cls, key) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    if (key) td.dataset.key = key;
    return td;
  }

  function head(row, parts) {
    const th = document.createElement("th");
    const [top, bottom] = parts;
    th.append(top);
    if (bottom) th.append(document.createElement("br"), bottom);
    row.append(th);
  }

  // The live table: a column of requests and of mean e2e over every route (a / b / c,
  // in the configuration's order), and one of acceptance per speculative route.
  function showStats(s) {
    setRoutes(s.routes);
    const names = routes.map((r) => r.name);
    const drafting = routes.filter((r) => r.num_speculative_tokens > 0);
    const top = document.createElement("tr");
    head(top, ["workload"]);
    head(top, ["requests", names.join(" / ")]);
    for (const r of drafting) head(top, [`acceptance, ${r.name}`, "measured / believed"]);
    const e2e = document.createElement("i");
    e2e.textContent = "not paired";
    head(top, [`mean e2e, ${names.join(" / ")}`, e2e]);
    head(top, ["live speedup"]);
    $("live-table").querySelector("thead").replaceChildren(top);
    const body = $("live-table").querySelector("tbody");
    body.replaceChildren();
    for (const [name, w] of Object.entries(s.workloads)) {
      const tr = document.createElement("tr");
      tr.dataset.workload = name;
      tr.append(cell(name), cell(names.map((r) => String(w.requests[r] || 0)).join(" / ")));
      for (const r of drafting) {
        const acc = w.acceptance[r.name] || {};
        const measured = acc.measured_rate === null || acc.measured_rate === undefined
          ? (acc.measured_requests === null ? "not by route" : "none yet")
          : `${acc.measured_rate.toFixed(2)} (${acc.measured_requests})`;
        const believed = acc.believed_rate === null || acc.believed_rate === undefined
          ? "–" : acc.believed_rate.toFixed(2);
        const td = cell(`${measured} / ${believed}`, acc.measured_rate === null ? "na" : "");
        td.dataset.route = r.name;
        tr.append(td);
      }
      tr.append(
        cell(names.map((r) => (w.e2e_mean_s[r] === null || w.e2e_mean_s[r] === undefined
          ? "–" : secs(w.e2e_mean_s[r]))).join(" / ")),
        w.speedup === null ? cell("not measured", "na")
          : cell(`${w.speedup.toFixed(2)}x (${w.shadow_pairs})`),
      );
      body.append(tr);
    }
    const reasons = Object.entries(s.reasons).map(([r, n]) => `${r} ${n}`).join(", ");
    $("live-notes").textContent = "Route mix: " +
      names.map((r) => `${r} ${s.requests[r] || 0}`).join(", ") +
      `. Decisions by reason: ${reasons || "none yet"}. Live speedup: ${s.speedup.why}. ` +
      "Acceptance: accepted / drafted tokens (measured: mean per request on that route, " +
      "and how many; believed: the policy's estimate for that route).";
    const health = names.map((r) => `${r} ${s.backends[r] && s.backends[r].healthy ? "up" : "DOWN"}`);
    $("health").textContent = "backends: " + health.join(", ");
    $("health").classList.toggle("bad", names.some((r) => !(s.backends[r] && s.backends[r].healthy)));
  }

  async function refreshStats() {
    try {
      showStats(await api("/stats"));
    } catch (e) {
      $("live-notes").textContent = "Live figures unavailable: " + e.message;
      if (!routes.length) $("routes-note").textContent = "no routes yet: " + e.message;
    }
  }

  async function loadModels() {
    try {
      const models = await api("/v1/models");
      const select = $("model");
      select.replaceChildren();
      for (const m of models.data) {
        const o = document.createElement("option");
        o.value = o.textContent = m.id;
        select.append(o);
      }
    } catch (_) { /* the servers' own model: the body names none */ }
  }

  // ---- run -------------------------------------------------------------------------

  async function run() {
    if (running || !routes.length) return;
    running = true;
    $("run").disabled = true;
    document.body.dataset.run = "running";
    const mode = document.querySelector("input[name=mode]:checked").value;
    $("verdict").hidden = true;
    try {
      let body;
      try {
        body = buildBody();
      } catch (e) {
        decisionFailed(e.message);
        for (const s of Object.values(sides)) s.fail("error", "not sent: " + e.message);
        return;
      }
      let decision = null;
      try {
        decision = await api("/decide" + CHAT, { method: "POST", body: JSON.stringify(body) });
        showDecision(decision);
      } catch (e) {
        decisionFailed(e.status ? `The gateway refused this request (${e.status}): ${e.message}`
          : "The decision failed: " + e.message);
      }
      const columns = Object.values(sides); // the configuration's order
      if (mode === "together") {
        await Promise.all(columns.map((side) => side.run(body)));
      } else {
        for (const side of columns) await side.run(body);
      }
      showVerdict(decision, mode);
      await refreshStats();
    } finally {
      running = false;
      $("run").disabled = false;
      document.body.dataset.run = "finished";
    }
  }

  // ---- formatting ------------------------------------------------------------------

  function ms(s) { return `${(s * 1000).toFixed(0)} ms`; }
  function secs(s) { return `${s.toFixed(3)} s`; }
  function ratio(x) { return `${x.toFixed(2)}x`; }

  // ---- start -----------------------------------------------------------------------

  function start() {
    const presets = $("presets");
    for (const p of PRESETS) {
      const b = document.createElement("button");
      b.type = "button";
      b.dataset.preset = p.id;
      b.textContent = p.label;
      b.addEventListener("click", () => applyPreset(p));
      presets.append(b);
    }
    applyPreset(PRESETS[0]);
    $("run").addEventListener("click", run);
    $("key-form").addEventListener("submit", (event) => {
      event.preventDefault();
      apiKey = $("key").value.trim();
      $("key").value = "";
      $("key-error").textContent = "";
      $("key-form").hidden = true;
      refreshStats().then(loadModels);
    });
    refreshStats().then(loadModels);
    setInterval(() => {
      if (!running && !document.hidden && $("key-form").hidden) refreshStats();
    }, REFRESH_MS);
    document.body.dataset.ready = "true";
  }

  start();
})();
