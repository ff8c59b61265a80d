// The MSL code editor of mtwork.editor: CodeMirror 6 with C++ highlighting plus Metal's
// address spaces and [[attributes]], line numbers, bracket matching, and the compiler's
// diagnostics shown inline. Bundled into ../static/editor.js (see mtwork/editor/__init__.py).
//
// Model traits (mtwork.editor.widget.CodeEditor): source, header (the texts), file_names
// ({source, header?}), active (the file shown), diagnostics ([{file, line, col, severity,
// message}], 1-based), status and status_text (what the loop is doing), dirty, uid.
// Messages sent to Python: {type: "run"} (Ctrl/Cmd-Enter, Run button), {type: "save"}.
// A click on a row of the kernel's log (mtwork/editor/panels.py: data-mtw-uid, -file and
// -line) selects that line here.

import { EditorView, basicSetup } from "codemirror";
import { EditorState, Prec, RangeSetBuilder, StateEffect, StateField } from "@codemirror/state";
import { Decoration, MatchDecorator, ViewPlugin, keymap } from "@codemirror/view";
import { cpp } from "@codemirror/lang-cpp";
import { syntaxTree } from "@codemirror/language";
import { lintGutter, setDiagnostics } from "@codemirror/lint";

const SYNC_DELAY_MS = 150; // typing is sent to Python at most this often

// Metal words C++ does not know: address spaces, the kernel keyword, vector/matrix types.
const MSL_KEYWORDS = /\b(kernel|device|constant|threadgroup|thread|threadgroup_imageblock)\b/g;
const MSL_TYPES =
  /\b(half|bfloat|(?:bool|char|uchar|short|ushort|int|uint|long|ulong|half|bfloat|float)[234](?:x[234])?|simdgroup_(?:half|float|bfloat)8x8)\b/g;
const MSL_ATTRIBUTES = /\[\[[^\]\n]*\]\]/g;

const NOT_CODE = /Comment|String|CharLiteral/;

function highlighter(regexp, className) {
  const mark = Decoration.mark({ class: className });
  const decorator = new MatchDecorator({
    regexp,
    decorate(add, from, to, _match, view) {
      // Leave words in comments and strings alone.
      if (!NOT_CODE.test(syntaxTree(view.state).resolveInner(from, 1).name)) add(from, to, mark);
    },
  });
  return ViewPlugin.fromClass(
    class {
      constructor(view) { this.decorations = decorator.createDeco(view); }
      update(update) { this.decorations = decorator.updateDeco(update, this.decorations); }
    },
    { decorations: (plugin) => plugin.decorations },
  );
}

const mslHighlighting = [
  highlighter(MSL_KEYWORDS, "cm-msl-keyword"),
  highlighter(MSL_TYPES, "cm-msl-type"),
  highlighter(MSL_ATTRIBUTES, "cm-msl-attribute"),
];

// Whole-line marks on the lines the compiler complained about, kept in place while typing.
const setErrorLines = StateEffect.define();
const errorLines = StateField.define({
  create: () => Decoration.none,
  update(lines, tr) {
    lines = lines.map(tr.changes);
    for (const effect of tr.effects) if (effect.is(setErrorLines)) lines = effect.value;
    return lines;
  },
  provide: (field) => EditorView.decorations.from(field),
});

function lineDecorations(doc, diagnostics) {
  const builder = new RangeSetBuilder();
  const seen = new Set();
  const sorted = diagnostics.filter((d) => d.severity === "error")
    .map((d) => Math.min(Math.max(d.line, 1), doc.lines)).sort((a, b) => a - b);
  for (const number of sorted) {
    if (seen.has(number)) continue;
    seen.add(number);
    const line = doc.line(number);
    builder.add(line.from, line.from, Decoration.line({
      attributes: { class: "cm-mtw-error-line", "data-mtw-line": String(number) },
    }));
  }
  return builder.finish();
}

function toLint(doc, d) {
  const line = doc.line(Math.min(Math.max(d.line, 1), doc.lines));
  const from = Math.min(line.from + Math.max(d.col - 1, 0), line.to);
  // Underline from the column to the end of the word there (at least one character).
  const rest = doc.sliceString(from, line.to);
  const word = /^[\w.]+/.exec(rest);
  const to = Math.min(from + (word ? word[0].length : 1), line.to);
  const severity = d.severity === "note" ? "info" : d.severity;
  return { from, to: Math.max(to, from), severity, message: d.message, source: "clang" };
}

function diagnosticsEffects(state, diagnostics) {
  const doc = state.doc;
  return [
    setDiagnostics(state, diagnostics.map((d) => toLint(doc, d))).effects,
    setErrorLines.of(lineDecorations(doc, diagnostics)),
  ].flat();
}

const theme = EditorView.theme({
  "&": { fontSize: "13px", border: "1px solid var(--jp-border-color1, #ccc)" },
  ".cm-scroller": { fontFamily: "var(--jp-code-font-family, monospace)" },
  ".cm-mtw-error-line": { backgroundColor: "rgba(207, 34, 46, 0.12)" },
  ".cm-msl-keyword": { color: "#8250df", fontWeight: "bold" },
  ".cm-msl-type": { color: "#0550ae" },
  ".cm-msl-attribute": { color: "#953800" },
});

function commonText(a, b) {
  // The smallest replacement turning a into b, so the cursor stays where it was.
  let start = 0;
  while (start < a.length && start < b.length && a[start] === b[start]) start++;
  let endA = a.length, endB = b.length;
  while (endA > start && endB > start && a[endA - 1] === b[endB - 1]) { endA--; endB--; }
  return { from: start, to: endA, insert: b.slice(start, endB) };
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function hideStaticCopies(uid) {
  // The text/html snapshot displayed beside the widget is for exported HTML; hide it here.
  const id = `mtw-editor-hide-${uid}`;
  if (!uid || document.getElementById(id)) return;
  const style = element("style");
  style.id = id;
  style.textContent =
    `.jp-OutputArea-child:has([data-mtw-static="${uid}"]) { display: none; }\n` +
    `[data-mtw-static="${uid}"] { display: none; }`;
  document.head.appendChild(style);
}

function render({ model, el }) {
  const files = () => Object.keys(model.get("file_names") || { source: "" });
  const root = element("div", "mtw-editor");
  root.setAttribute("data-lm-suppress-shortcuts", "true"); // keys belong to the editor
  const bar = element("div", "mtw-editor-bar");
  const tabs = element("div", "mtw-editor-tabs");
  const status = element("span", "mtw-editor-status");
  const runButton = element("button", "mtw-editor-button mtw-editor-run", "Run");
  runButton.title = "Compile and run now (Ctrl/Cmd-Enter)";
  const saveButton = element("button", "mtw-editor-button mtw-editor-save", "Save");
  saveButton.title = "Write the buffers back to their .metal/.h files (Ctrl/Cmd-S)";
  bar.append(tabs, status, runButton, saveButton);
  const host = element("div", "mtw-editor-cm");
  host.style.height = model.get("height") || "320px";
  root.append(bar, host);
  el.appendChild(root);
  hideStaticCopies(model.get("uid"));

  const synced = {}; // the text of each file Python last saw
  const timers = {};
  const states = {};
  let active = model.get("active") || "source";
  let view = null;

  function flush(file) {
    clearTimeout(timers[file]);
    delete timers[file];
    const text = file === active && view ? view.state.doc.toString() : states[file].doc.toString();
    if (text === synced[file]) return;
    synced[file] = text;
    model.set(file, text);
    model.save_changes();
  }

  function runNow() {
    files().forEach(flush);
    model.send({ type: "run" });
    return true;
  }

  function saveNow() {
    files().forEach(flush);
    model.send({ type: "save" });
    return true;
  }

  const commands = Prec.highest(keymap.of([
    { key: "Mod-Enter", run: runNow },
    { key: "Mod-s", run: saveNow, preventDefault: true },
  ]));

  function makeState(file) {
    synced[file] = model.get(file) || "";
    return EditorState.create({
      doc: synced[file],
      extensions: [
        basicSetup, cpp(), mslHighlighting, lintGutter(), errorLines, theme, commands,
        EditorView.domEventHandlers({ blur: () => { files().forEach(flush); } }),
        EditorView.updateListener.of((update) => {
          if (!update.docChanged) return;
          clearTimeout(timers[file]);
          timers[file] = setTimeout(() => flush(file), SYNC_DELAY_MS);
        }),
      ],
    });
  }

  for (const file of files()) states[file] = makeState(file);
  if (!states[active]) active = "source";
  view = new EditorView({ state: states[active], parent: host });

  function stateOf(file) { return file === active ? view.state : states[file]; }

  function showDiagnostics() {
    const all = model.get("diagnostics") || [];
    for (const file of files()) {
      const state = stateOf(file);
      const effects = diagnosticsEffects(state, all.filter((d) => d.file === file));
      if (file === active) view.dispatch({ effects });
      else states[file] = state.update({ effects }).state;
    }
  }

  function showTabs() {
    tabs.textContent = "";
    const names = model.get("file_names") || {};
    for (const file of files()) {
      const tab = element("button", "mtw-editor-tab", names[file] || file);
      tab.dataset.file = file;
      if (file === active) tab.classList.add("mtw-editor-tab-active");
      const count = (model.get("diagnostics") || [])
        .filter((d) => d.file === file && d.severity === "error").length;
      if (count) tab.append(element("span", "mtw-editor-tab-errors", ` ${count}`));
      tab.addEventListener("click", () => switchTo(file));
      tabs.appendChild(tab);
    }
  }

  function switchTo(file) {
    if (file === active || !states[file]) return;
    states[active] = view.state;
    active = file;
    view.setState(states[file]);
    model.set("active", file);
    model.save_changes();
    showTabs();
    view.focus();
  }

  function showStatus() {
    const kind = model.get("status") || "idle";
    status.className = `mtw-editor-status mtw-editor-status-${kind}`;
    status.textContent = model.get("status_text") || "";
    saveButton.classList.toggle("mtw-editor-dirty", !!model.get("dirty"));
  }

  function fromPython(file) {
    // Python replaced a text (load, revert, set_source): take it unless it is what we sent.
    const text = model.get(file) || "";
    if (text === synced[file]) return;
    synced[file] = text;
    const state = stateOf(file);
    const current = state.doc.toString();
    if (text === current) return;
    const changes = commonText(current, text);
    if (file === active) view.dispatch({ changes });
    else states[file] = state.update({ changes }).state;
  }

  function showLine(file, number) {
    if (!states[file]) return;
    switchTo(file);
    const doc = view.state.doc;
    const line = doc.line(Math.min(Math.max(number, 1), doc.lines));
    view.dispatch({ selection: { anchor: line.from, head: line.to }, scrollIntoView: true });
    view.focus();
  }

  function onLogClick(event) {
    const row = event.target.closest ? event.target.closest("[data-mtw-line]") : null;
    if (!row || row.dataset.mtwUid !== model.get("uid")) return;
    showLine(row.dataset.mtwFile, Number(row.dataset.mtwLine));
  }

  runButton.addEventListener("click", runNow);
  saveButton.addEventListener("click", saveNow);
  document.addEventListener("click", onLogClick);
  const listeners = [
    ["change:source", () => fromPython("source")],
    ["change:header", () => fromPython("header")],
    ["change:diagnostics", () => { showDiagnostics(); showTabs(); }],
    ["change:status", showStatus],
    ["change:status_text", showStatus],
    ["change:dirty", showStatus],
    ["change:active", () => switchTo(model.get("active"))],
  ];
  for (const [event, handler] of listeners) model.on(event, handler);

  showTabs();
  showStatus();
  showDiagnostics();

  return () => {
    document.removeEventListener("click", onLogClick);
    for (const file of Object.keys(timers)) flush(file);
    for (const [event, handler] of listeners) model.off(event, handler);
    view.destroy();
  };
}

export default { render };
