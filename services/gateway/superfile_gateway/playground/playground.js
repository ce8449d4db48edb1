// The search playground: a page over the gateway's REST API (docs/gateway.md, "The playground").
// Every value from the server is written with textContent: nothing it returns is ever parsed as HTML.
"use strict";

const KEY_STORE = "superfile.playground.apiKey"; // sessionStorage: this tab only, gone when it closes

const $ = (id) => document.getElementById(id);
const keyInput = $("api-key");
const tableSelect = $("table");
const status = $("status");
const results = $("results");
let current = null; // {name, text, vectors, columns} of the chosen table
let runs = 0;

function setStatus(state, text) {
  status.dataset.state = state;
  status.textContent = text;
}

function option(value, label) {
  const o = document.createElement("option");
  o.value = value;
  o.textContent = label;
  return o;
}

// One call to the API: paths are relative to the page, so it works below a proxy's prefix too.
async function api(method, path, body) {
  const headers = { accept: "application/json" };
  const key = keyInput.value.trim();
  if (key) headers.authorization = `Bearer ${key}`;
  const init = { method, headers };
  if (body !== undefined) {
    headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const text = await response.text();
  let doc = null;
  try {
    doc = text ? JSON.parse(text) : null;
  } catch {
    doc = null;
  }
  if (!response.ok) {
    const detail = doc && doc.error ? `${doc.error.type}: ${doc.error.message}` : text.slice(0, 200);
    throw new Error(`${response.status} ${detail}`);
  }
  return doc;
}

const tablePath = (name) => `tables/${encodeURIComponent(name)}`;

async function loadTables() {
  sessionStorage.setItem(KEY_STORE, keyInput.value);
  setStatus("busy", "Loading tables…");
  try {
    const { tables } = await api("GET", "tables");
    if (tables.length) {
      tableSelect.replaceChildren(...tables.map((name) => option(name, name)));
    } else {
      tableSelect.replaceChildren(option("", "(no table this key can read)"));
    }
    setStatus("ok", `${tables.length} table${tables.length === 1 ? "" : "s"}`);
    if (tables.length) await selectTable(tableSelect.value);
  } catch (e) {
    setStatus("error", e.message);
  }
}

async function selectTable(name) {
  current = null;
  if (!name) return;
  try {
    const info = await api("GET", tablePath(name));
    if (tableSelect.value !== name) return; // another table was chosen meanwhile
    const options = info.options || {};
    const text = Object.keys(options.fts_columns || {});
    const vectors = Object.keys(options.vector_columns || {});
    // searches return every column but the vectors, so that rows stay readable
    const columns = info.schema.map((f) => f.name).filter((n) => n !== "_id" && !vectors.includes(n));
    current = { name, text, vectors, columns };
    for (const select of document.querySelectorAll("select[data-columns]")) {
      const names = select.dataset.columns === "text" ? text : vectors;
      const kept = select.value;
      select.replaceChildren(...names.map((n) => option(n, n)));
      if (names.includes(kept)) select.value = kept;
    }
    $("table-info").textContent =
      `version ${info.version} · full text: ${text.join(", ") || "none"} · vectors: ${vectors.join(", ") || "none"}`;
    const sql = $("form-sql").elements.namedItem("query");
    if (!sql.value) sql.value = `SELECT * FROM "${name}" LIMIT 10`;
  } catch (e) {
    setStatus("error", e.message);
  }
}

function chosen() {
  if (!current) throw new Error("choose a table first");
  return current;
}

const value = (form, name) => form.elements.namedItem(name).value;

function count(form, name) {
  const n = Number(value(form, name));
  if (!Number.isSafeInteger(n) || n < 0) throw new Error(`${name} must be a whole number`);
  return n;
}

function search(kind, body) {
  const table = chosen();
  return api("POST", `${tablePath(table.name)}/search/${kind}`, { ...body, projection: table.columns });
}

// The vector of the row with this _id (read with a scan of that one column).
async function exampleVector(column, form) {
  const table = chosen();
  const id = count(form, "example");
  const found = await api("POST", `${tablePath(table.name)}/scan`, { columns: [column], where: `_id = ${id}` });
  if (!found.rows.length) throw new Error(`no row with _id ${id} in ${table.name}`);
  return found.rows[0][column];
}

const runners = {
  bm25: (f) => search("bm25", { column: value(f, "column"), query: value(f, "query"), k: count(f, "k") }),
  async vector(f) {
    const column = value(f, "column");
    return search("vector", { column, vector: await exampleVector(column, f), k: count(f, "k") });
  },
  async hybrid(f) {
    const vectorColumn = value(f, "vector_column");
    return search("hybrid", {
      text_column: value(f, "text_column"),
      query: value(f, "query"),
      vector_column: vectorColumn,
      vector: await exampleVector(vectorColumn, f),
      k: count(f, "k"),
    });
  },
  sql: (f) => api("POST", "sql", { query: value(f, "query") }),
};

const SCORES = {
  bm25: "score: BM25, higher is better",
  vector: "score: the distance to the example, lower is nearer",
  hybrid: "score: reciprocal rank fusion of BM25 and the vector search, higher is better",
};

function show(v) {
  if (v === null || v === undefined) return "null";
  return typeof v === "object" ? JSON.stringify(v) : String(v);
}

function render(result) {
  const table = document.createElement("table");
  const head = table.createTHead().insertRow();
  for (const column of result.columns) {
    const th = document.createElement("th");
    th.scope = "col";
    th.textContent = column;
    head.appendChild(th);
  }
  const body = table.createTBody();
  for (const row of result.rows) {
    const tr = body.insertRow();
    for (const column of result.columns) {
      const v = row[column];
      const td = tr.insertCell();
      td.textContent = show(v);
      if (v === null || v === undefined) {
        td.className = "null";
      } else if (column === "score") {
        td.className = "score";
      } else if (column === "_id") {
        td.className = "id";
        td.title = "use this row as the example of a vector or hybrid search";
        td.addEventListener("click", () => useExample(v));
      } else if (typeof v === "object") {
        td.title = td.textContent;
      }
    }
  }
  results.replaceChildren(table);
}

function useExample(id) {
  for (const input of document.querySelectorAll("input[name=example]")) input.value = String(id);
  if (!["vector", "hybrid"].includes(document.querySelector("[role=tab][aria-selected=true]").dataset.tab)) {
    showTab("vector");
  }
}

async function run(kind, form) {
  setStatus("busy", "Running…");
  const started = performance.now();
  try {
    const result = await runners[kind](form);
    render(result);
    const ms = Math.round(performance.now() - started);
    runs += 1;
    status.dataset.runs = String(runs);
    const rows = `${result.num_rows} row${result.num_rows === 1 ? "" : "s"} in ${ms} ms`;
    setStatus("ok", SCORES[kind] ? `${rows} · ${SCORES[kind]}` : rows);
  } catch (e) {
    results.replaceChildren();
    runs += 1;
    status.dataset.runs = String(runs);
    setStatus("error", e.message);
  }
}

function showTab(name) {
  for (const tab of document.querySelectorAll("[role=tab]")) {
    tab.setAttribute("aria-selected", String(tab.dataset.tab === name));
  }
  for (const panel of document.querySelectorAll("[data-tab-panel]")) panel.hidden = panel.dataset.tabPanel !== name;
}

keyInput.addEventListener("input", () => sessionStorage.setItem(KEY_STORE, keyInput.value));
$("load-tables").addEventListener("click", loadTables);
tableSelect.addEventListener("change", () => selectTable(tableSelect.value));
for (const tab of document.querySelectorAll("[role=tab]")) tab.addEventListener("click", () => showTab(tab.dataset.tab));
for (const form of document.querySelectorAll("form[data-tab-panel]")) {
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    run(form.dataset.tabPanel, form);
  });
}

keyInput.value = sessionStorage.getItem(KEY_STORE) || "";
if (keyInput.value) loadTables(); // back on the page in the same tab: the key is still there
