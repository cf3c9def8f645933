// A stand-in for ComfyUI's scripts/api.js, written for the browser test: just enough of `api` for the pack's glue.
// receive() replays one websocket JSON message the way the frontend hands it to listeners (docs in
// /work/shared/comfyui.md): `executing` carries the node id, `status` its `status` field, known built-in types their
// data, and custom types (h3.*) only reach listeners registered for them.
const BUILTIN = new Set(["execution_start", "execution_error", "execution_interrupted", "execution_cached",
  "execution_success", "progress", "progress_state", "executed", "graphChanged", "promptQueued", "logs", "b_preview",
  "notification", "progress_text"]);

class FakeApi extends EventTarget {
  constructor() {
    super();
    this.registered = new Set();
    this.ignored = [];
    this.fetched = [];
  }

  addEventListener(type, callback, options) {
    super.addEventListener(type, callback, options);
    this.registered.add(type);
  }

  dispatchCustomEvent(type, detail) {
    return super.dispatchEvent(new CustomEvent(type, { detail }));
  }

  receive(msg) {
    if (!msg || typeof msg.type !== "string") return;
    const { type, data } = msg;
    if (type === "status") this.dispatchCustomEvent("status", data?.status ?? null);
    else if (type === "executing") this.dispatchCustomEvent("executing", data?.display_node || data?.node || null);
    else if (BUILTIN.has(type) || this.registered.has(type)) this.dispatchCustomEvent(type, data);
    else this.ignored.push(type);
  }

  replay(messages) {
    for (const m of messages) this.receive(m);
  }

  /** What a dropped and re-opened websocket looks like to listeners. */
  reconnect() {
    this.dispatchCustomEvent("status", null);
    this.dispatchCustomEvent("reconnecting");
    this.dispatchCustomEvent("reconnected");
  }

  apiURL(route) {
    return `/api${route}`;
  }

  fetchApi(route, options) {
    this.fetched.push(route);
    return fetch(this.apiURL(route), options);
  }
}

export const api = new FakeApi();
