// A stand-in for ComfyUI's scripts/app.js, written for the browser test: extension registry, extension loading from
// GET /api/extensions (as ComfyUI does: every .js of a pack's web/ folder), settings, a sidebar and graph nodes that
// implement addDOMWidget by putting the element into the node's body.
import { api } from "./api.js";

class FakeNode {
  constructor(id, type) {
    this.id = id;
    this.type = type;
    this.comfyClass = type;
    this.title = type;
    this.widgets = [];
    this.size = [330, 40];
    this.box = document.createElement("div");
    this.box.className = "node";
    this.box.dataset.nodeId = String(id);
    this.box.dataset.type = type;
    const title = document.createElement("div");
    title.className = "node-title";
    title.textContent = type;
    const idEl = document.createElement("span");
    idEl.className = "id";
    idEl.textContent = `#${id}`;
    title.appendChild(idEl);
    this.body = document.createElement("div");
    this.body.className = "node-body";
    this.box.append(title, this.body);
  }

  addDOMWidget(name, type, element, options = {}) {
    const widget = { name, type, element, options, value: undefined };
    this.widgets.push(widget);
    this.body.appendChild(element);
    return widget;
  }

  computeSize() {
    return [330, 30 + this.widgets.reduce((a, w) => a + (w.options?.getMinHeight?.() ?? 20), 0)];
  }

  setSize(size) {
    this.size = size;
  }
}

class Settings {
  constructor(app) {
    this.app = app;
    this.values = new Map();
  }

  definition(id) {
    for (const ext of this.app.extensions) for (const s of ext.settings ?? []) if (s.id === id) return s;
    return null;
  }

  get(id) {
    return this.values.has(id) ? this.values.get(id) : this.definition(id)?.defaultValue;
  }

  set(id, value) {
    const old = this.get(id);
    this.values.set(id, value);
    this.definition(id)?.onChange?.(value, old);
  }
}

export const app = {
  extensions: [],
  graph: { nodes: [] },
  sidebarTabs: [],
  registerExtension(ext) {
    this.extensions.push(ext);
  },
  async boot({ sidebar = true } = {}) {
    this.settings = new Settings(this);
    if (sidebar) {
      this.extensionManager = {
        setting: { get: (id) => this.settings.get(id), set: (id, v) => this.settings.set(id, v) },
        registerSidebarTab: (tab) => this.addSidebarTab(tab),
      };
    } else {
      this.ui = { settings: { getSettingValue: (id) => this.settings.get(id) } };
    }
    const urls = await (await api.fetchApi("/extensions")).json();
    for (const url of urls) await import(url);
    for (const ext of this.extensions) await ext.init?.(this);
    for (const ext of this.extensions) await ext.setup?.(this);
  },
  addSidebarTab(tab) {
    this.sidebarTabs.push(tab);
    const b = document.createElement("button");
    b.textContent = tab.title;
    b.title = tab.tooltip ?? "";
    b.dataset.tab = tab.id;
    b.addEventListener("click", () => this.openSidebarTab(tab.id));
    document.getElementById("sidebar-icons").appendChild(b);
  },
  openSidebarTab(id) {
    // as ComfyUI's frontend (1.49) does: destroy() the open custom tab, render(el) into a NEW element that is not
    // in the page yet, attach it afterwards
    const tab = this.sidebarTabs.find((t) => t.id === id);
    const content = document.getElementById("sidebar-content");
    this.openTab?.destroy?.();
    const el = document.createElement("div");
    el.dataset.tab = id;
    tab.render(el);
    content.replaceChildren(el);
    this.openTab = tab;
  },
  addNode(id, type) {
    const node = new FakeNode(id, type);
    this.graph.nodes.push(node);
    document.getElementById("graph").appendChild(node.box);
    for (const ext of this.extensions) ext.nodeCreated?.(node, this);
    return node;
  },
};
