// ComfyUI loads every .js under web/ as an extension script: the view modules must import nothing from ComfyUI
// and do nothing when loaded (only exports). Only the glue imports ../../scripts/app.js and api.js.
// Run: node --test tests/web/
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const WEB = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "web");
const GLUE = "h3_extension.js";
const files = readdirSync(WEB).filter((f) => f.endsWith(".js")).sort();

test("web/ holds the glue and the view modules", () => {
  for (const f of [GLUE, "h3_view.js", "h3_timeline.js", "h3_dom.js"]) assert.ok(files.includes(f), f);
});

for (const f of files.filter((x) => x !== GLUE)) {
  test(`${f}: no ComfyUI import, only relative imports of view modules`, () => {
    const src = readFileSync(join(WEB, f), "utf8");
    assert.doesNotMatch(src, /scripts\/(app|api)\.js/);
    const imports = [...src.matchAll(/^\s*import\s[^;]*?from\s+["']([^"']+)["']/gm)].map((m) => m[1]);
    for (const spec of imports) {
      assert.match(spec, /^\.\/h3_[a-z_]+\.js$/, `${f} imports ${spec}`);
      assert.notEqual(spec, `./${GLUE}`);
    }
  });

  test(`${f}: loads without a DOM and without side effects`, async () => {
    const before = new Set(Object.keys(globalThis));
    const mod = await import(join(WEB, f));
    assert.ok(Object.keys(mod).length > 0);
    const added = Object.keys(globalThis).filter((k) => !before.has(k));
    assert.deepEqual(added, []);
  });
}

test("the glue imports ComfyUI through ../../scripts/ and registers one extension", () => {
  const src = readFileSync(join(WEB, GLUE), "utf8");
  assert.match(src, /import \{ app \} from "\.\.\/\.\.\/scripts\/app\.js"/);
  assert.match(src, /import \{ api \} from "\.\.\/\.\.\/scripts\/api\.js"/);
  assert.equal(src.match(/app\.registerExtension\(/g).length, 1);
  assert.match(src, /addDOMWidget\(/);
  assert.match(src, /serialize: false/);
});
