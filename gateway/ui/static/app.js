// specroute side by side: one prompt on both routes through this gateway.
// No framework, no build step, nothing loaded from elsewhere (the page's CSP
// allows this gateway only). Every text from a server goes in with
// textContent, never as HTML. The API key lives in `apiKey` and nowhere else.
"use strict";

(() => {
  const ROUTES = ["speculative", "baseline"];
  const CHAT = "/v1/chat/completions";
  const REFRESH_MS = 10000;
  let apiKey = null; // memory only: no storage, no cookie
  let running = false;

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

  class Side {
    constructor(route) {
      this.route = route;
      this.el = $("side-" + route);
      this.result = null;
    }

    set(state, label) {
      this.el.dataset.state = state;
      this.el.querySelector(".state").textContent = label;
    }

    reset() {
      this.result = null;
      this.el.classList.remove("faster");
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
      return this.route === "baseline"
        ? ["not reported: no drafts", null, "the baseline server does not speculate"]
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
          headers: headers({ "x-specroute-route": this.route }),
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

  const sides = Object.fromEntries(ROUTES.map((r) => [r, new Side(r)]));

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
    const panel = $("decision");
    panel.dataset.state = "decided";
    panel.dataset.route = d.route;
    panel.dataset.reason = d.reason;
    $("decision-summary").textContent =
      `The gateway would send this to ${d.route}: ${d.reason} (policy ${d.policy}).`;
    const p = d.predicted_s || {};
    const speedup = d.predicted_speedup;
    const a = d.acceptance;
    pairs($("prediction"), [
      ["predicted speculative", p.speculative === undefined ? "–" : secs(p.speculative), "spec"],
      ["predicted baseline", p.baseline === undefined ? "–" : secs(p.baseline), "base"],
      ["predicted speedup", speedup === null ? "– (this policy predicts no latencies)"
        : ratio(speedup), "speedup"],
      ["believed acceptance", a.rate === null ? "no estimate" : a.rate.toFixed(2), "acceptance"],
    ]);
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
    $("decision-summary").textContent = message;
    $("decision-detail").hidden = true;
  }

  function showVerdict(decision, mode) {
    const v = $("verdict");
    const spec = sides.speculative.result;
    const base = sides.baseline.result;
    v.hidden = false;
    delete v.dataset.right;
    if (!spec || !base) {
      v.dataset.faster = "";
      v.textContent = "No comparison: one side did not finish (see its message).";
      return;
    }
    const measured = base.e2e / spec.e2e;
    const faster = measured >= 1 ? "speculative" : "baseline";
    sides[faster].el.classList.add("faster");
    v.dataset.faster = faster;
    v.dataset.measured = String(measured);
    const parts = [`Measured speedup ${ratio(measured)} (baseline ${secs(base.e2e)} / ` +
      `speculative ${secs(spec.e2e)}): ${faster} was faster.`];
    if (decision && decision.predicted_speedup !== null) {
      v.dataset.predicted = String(decision.predicted_speedup);
      parts.push(`Predicted ${ratio(decision.predicted_speedup)}.`);
    }
    if (decision) {
      v.dataset.right = String(decision.route === faster);
      parts.push(decision.route === faster
        ? `The gateway's choice, ${decision.route}, was the faster one.`
        : `The gateway would have chosen ${decision.route}, the slower one here.`);
    }
    parts.push(mode === "together"
      ? "Both ran at once: on one shared GPU each slowed the other, and the prediction " +
        "is for a request alone."
      : "They ran one after the other, each alone.");
    v.textContent = parts.join(" ");
  }

  // ---- live figures ----------------------------------------------------------------

  function cell(text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    return td;
  }

  function showStats(s) {
    const body = $("live-table").querySelector("tbody");
    body.replaceChildren();
    for (const [name, w] of Object.entries(s.workloads)) {
      const tr = document.createElement("tr");
      tr.dataset.workload = name;
      const acc = w.acceptance;
      const e2e = w.e2e_mean_s;
      tr.append(
        cell(name),
        cell(`${w.requests.speculative} / ${w.requests.baseline}`),
        acc.measured_rate === null ? cell("none yet", "na")
          : cell(`${acc.measured_rate.toFixed(2)} (${acc.measured_requests})`),
        cell(acc.believed_rate === null ? "–" : acc.believed_rate.toFixed(2)),
        cell(`${e2e.speculative === null ? "–" : secs(e2e.speculative)} / ` +
          `${e2e.baseline === null ? "–" : secs(e2e.baseline)}`),
        w.speedup === null ? cell("not measured", "na")
          : cell(`${w.speedup.toFixed(2)}x (${w.shadow_pairs})`),
      );
      body.append(tr);
    }
    const reasons = Object.entries(s.reasons).map(([r, n]) => `${r} ${n}`).join(", ");
    $("live-notes").textContent = `Route mix: speculative ${s.requests.speculative || 0}, ` +
      `baseline ${s.requests.baseline || 0}. Decisions by reason: ${reasons || "none yet"}. ` +
      `Live speedup: ${s.speedup.why}. Acceptance: accepted / drafted tokens (measured: ` +
      "mean per request, and how many; believed: the policy's estimate).";
    const health = ROUTES.map((r) => `${r} ${s.backends[r].healthy ? "up" : "DOWN"}`);
    $("health").textContent = "backends: " + health.join(", ");
    $("health").classList.toggle("bad", ROUTES.some((r) => !s.backends[r].healthy));
  }

  async function refreshStats() {
    try {
      showStats(await api("/stats"));
    } catch (e) {
      $("live-notes").textContent = "Live figures unavailable: " + e.message;
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
    if (running) return;
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
      if (mode === "together") {
        await Promise.all(ROUTES.map((r) => sides[r].run(body)));
      } else {
        for (const r of ROUTES) await sides[r].run(body);
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
    for (const s of Object.values(sides)) s.figures({});
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
