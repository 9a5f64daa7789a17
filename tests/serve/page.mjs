// The chat page (GET /) in headless Chromium through puppeteer-core: a message typed and sent, the streamed answer
// read from the DOM and compared with the same request through the API (greedy), a screenshot kept.
// usage: node page.mjs BASE_URL API_KEY SCREENSHOT CHROMIUM
import assert from "node:assert/strict";
import puppeteer from "puppeteer-core";

const [base, key, shot, chromium] = process.argv.slice(2);
const browser = await puppeteer.launch({
  executablePath: chromium, headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
try {
  const page = await browser.newPage();
  await page.setViewport({ width: 1000, height: 700 });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(base + "/", { waitUntil: "networkidle0" });
  await page.type("#key", key);
  await page.$eval("#max", (el) => { el.value = "32"; });
  const message = "def add(a, b):";
  await page.type("#input", message);
  await page.keyboard.press("Enter");
  await page.waitForSelector(".msg.assistant[data-done='1']", { timeout: 60000 });
  const answer = await page.$eval(".msg.assistant .answer", (el) => el.textContent);
  // this model does not reason: the reasoning fold stays hidden; the thinking switch is there
  assert.equal(await page.$eval(".msg.assistant details.reasoning", (el) => el.hidden), true);
  assert.equal(await page.$eval("#think", (el) => el.checked), true);
  const user = await page.$eval(".msg.user", (el) => el.textContent);
  assert.equal(user, message);
  const shown = await page.$$eval(".msg.error", (els) => els.map((el) => el.textContent));
  assert.deepEqual(shown, [], "the page showed an error");
  assert.deepEqual(errors, []);
  assert.match(await page.$eval("#stats", (el) => el.textContent), /tokens\/s/);
  await page.screenshot({ path: shot });
  // the same conversation through the API
  const r = await fetch(base + "/v1/chat/completions", {
    method: "POST", headers: { "Content-Type": "application/json", Authorization: "Bearer " + key },
    body: JSON.stringify({ messages: [{ role: "user", content: message }], max_tokens: 32, temperature: 0 }),
  });
  const want = (await r.json()).choices[0].message.content;
  assert.equal(answer, want, "the page's streamed answer equals the API's");
  console.log("  ok  chat page: typed " + JSON.stringify(message) + ", streamed " + JSON.stringify(answer.slice(0, 60)) +
              " = the API's answer; screenshot " + shot);
} finally {
  await browser.close();
}
