// The storefront of one flash sale (docs/storefront.md): plain JavaScript
// with no build step, talking to the public JSON API like any other client.
//
// - The sale (name, stock, status, window) is read from GET /sales/{id}
//   every few seconds while the tab is visible, less often when nothing can
//   change soon, never after the sale ended.
// - The countdown follows the service's clock: each read carries the
//   service's `now`, and the page keeps the offset between it and the
//   browser's monotonic clock (performance.now), so the browser's own date
//   never matters.
// - A purchase answer becomes words: 201 the order; 202 "queued", then the
//   result polled with wait_ms; 409 sold out / already bought / not started /
//   ended; 503 retried after its Retry-After with a visible note; no answer
//   or 504 retried with exponential backoff. Retrying is safe: a buyer holds
//   at most one order of a sale (the unique constraint on sale and buyer is
//   the idempotency key), so a repeat is answered "already purchased" — and
//   the page then shows the order — or, for a queued sale, with the same
//   request.
// - A sale with a waiting room (its `waiting_room` is not null) sells only to
//   a buyer the line has admitted: the button joins the line, the page asks
//   for the buyer's place every 500 ms and shows it, and once admitted buys
//   with the admission's token before it expires (see "The waiting room").
"use strict";

// ---- The buyer ---------------------------------------------------------
// With buyer authentication on, the service takes the buyer from a bearer
// token (a JWT whose `sub` is the user id), which a login in front of the
// service hands to the page in the URL fragment: `/sales/42#token=<jwt>`. The
// fragment never reaches a server (nor a log or a Referer); the page keeps the
// token for this tab (sessionStorage), removes it from the address bar, and
// sends it with every request. Without a token the buyer is a random id kept
// in this browser and sent as `user_id` — what a service with buyer
// authentication off (development, demos) expects. Everything that tells the
// service who buys goes through `buyer`.
const buyer = (() => {
  const TOKEN = "seckill.token";
  const fragment = new URLSearchParams(location.hash.slice(1)).get("token");
  if (fragment) {
    writeStorage(TOKEN, fragment, sessionStorage);
    history.replaceState(null, "", location.pathname + location.search);
  }
  const token = readStorage(TOKEN, sessionStorage);
  const subject = token && subjectOf(token);
  if (subject) {
    return {
      id: subject,
      signedIn: true,
      headers: () => ({ Authorization: `Bearer ${token}` }),
      purchaseBody: () => ({ quantity: 1 }),
      lineBody: () => ({}),
      orderPath: (sale) => `/sales/${sale}/buyers/${subject}/order`,
      linePath: (sale) => `/sales/${sale}/line/${subject}`,
    };
  }
  const KEY = "seckill.buyer";
  const stored = Number(readStorage(KEY));
  let id = stored;
  if (!Number.isSafeInteger(id) || id < 1) {
    const words = new Uint32Array(2);
    crypto.getRandomValues(words);
    // 52 random bits, exact in a JavaScript number; never 0.
    id = (words[0] & 0xfffff) * 2 ** 32 + words[1] + 1;
    writeStorage(KEY, String(id));
  }
  return {
    id,
    signedIn: false,
    headers: () => ({}),
    purchaseBody: () => ({ user_id: id, quantity: 1 }),
    lineBody: () => ({ user_id: id }),
    orderPath: (sale) => `/sales/${sale}/buyers/${id}/order`,
    linePath: (sale) => `/sales/${sale}/line/${id}`,
  };
})();

/** The `sub` of a JWT, as the digits it is (a user id may pass 2^53), or
 *  null. Read for display and the order's path only: the service verifies
 *  the token, the page cannot. */
function subjectOf(token) {
  try {
    const part = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    const claims = JSON.parse(atob(part));
    const sub = String(claims.sub);
    return /^\d{1,19}$/.test(sub) ? sub : null;
  } catch {
    return null;
  }
}

function readStorage(key, store = localStorage) {
  try { return store.getItem(key); } catch { return null; }
}
function writeStorage(key, value, store = localStorage) {
  try {
    if (value === null) store.removeItem(key); else store.setItem(key, value);
  } catch { /* storage refused (private mode): the page still works for this visit */ }
}

// ---- The service's clock -----------------------------------------------
const clock = {
  /** The service's time minus performance.now(), in ms; null before a read. */
  offset: null,
  /** A read sent at `sentAt` and answered at `receivedAt` (performance.now)
   *  carried the service's `now`: it was taken during the round trip, on
   *  average at its middle. */
  sync(serverNow, sentAt, receivedAt) {
    const server = parseTime(serverNow);
    if (!Number.isNaN(server)) this.offset = server - (sentAt + receivedAt) / 2;
  },
  /** The service's time now, ms since the epoch (NaN before a read). */
  now() { return this.offset === null ? NaN : performance.now() + this.offset; },
};

/** RFC 3339 → ms since the epoch; fractions beyond milliseconds dropped. */
function parseTime(text) {
  return typeof text === "string" ? Date.parse(text.replace(/(\.\d{3})\d+/, "$1")) : NaN;
}

// ---- Talking to the service ----------------------------------------------
/** `fetch` of a JSON resource: the answer and its body (null when not JSON).
 *  Throws only when no answer came (the network failed). */
async function api(path, init = {}) {
  const headers = { Accept: "application/json", ...buyer.headers(), ...(init.headers || {}) };
  const response = await fetch(path, { ...init, headers, cache: "no-store", credentials: "same-origin" });
  let body = null;
  try { body = await response.json(); } catch { /* an empty or non-JSON body */ }
  return { response, body };
}

/** The last segment of a problem's `type` (`sold-out`, `busy`, …). */
function problemKind(body) {
  return body && typeof body.type === "string" ? body.type.split("/").pop() : "";
}

/** Whole seconds of a Retry-After header; 1 when absent or unreadable. */
function retryAfterSeconds(response) {
  const seconds = Number(response.headers.get("Retry-After"));
  return Number.isFinite(seconds) && seconds >= 0 ? Math.max(1, Math.ceil(seconds)) : 1;
}

/** Exponential backoff before retry `n` (1-based): 0.5 s · 2^(n−1), at most
 *  8 s, with up to 50 % jitter so that a crowd does not retry in step. */
function backoffMs(n) {
  return Math.min(8000, 500 * 2 ** (n - 1)) * (1 + Math.random() * 0.5);
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// ---- The page ------------------------------------------------------------
const $ = (id) => document.getElementById(id);
const el = {
  form: $("open-sale"), saleNumber: $("sale-number"), sale: $("sale"), name: $("sale-name"),
  status: $("status"), countdown: $("countdown"), stockBar: $("stock-bar"), stock: $("stock"),
  buy: $("buy"), note: $("note"), result: $("result"), buyerId: $("buyer-id"), buyerHow: $("buyer-how"), fatal: $("fatal"),
  line: $("line"), lineStatus: $("line-status"), lineFacts: $("line-facts"), position: $("position"),
  ahead: $("ahead"), wait: $("wait"), pace: $("pace"), turn: $("turn"), leave: $("leave"),
};

const state = {
  saleId: null,
  /** The last GET /sales/{id} body. */
  sale: null,
  /** A purchase is in flight (its button stays disabled). */
  buying: false,
  /** This buyer holds an order of the sale (or it is settling). */
  done: false,
  /** The phase the page showed last, to notice the countdown's end. */
  shownPhase: null,
  pollTimer: null,
  /** Consecutive failed reads of the sale. */
  readFailures: 0,
  /** The first read of the sale is in flight (start() acts on it). */
  starting: false,
  /** The buyer's place in the waiting room: the last Place document the
   *  service answered (`waiting`, `admitted`, `sold_out`), or one of the
   *  page's own states (`joining`, `left`, `expired`, `lost`); null before
   *  joining. */
  line: null,
};

const PHASE_WORDS = {
  loading: "Loading…",
  not_started: "Not started yet",
  open: "Open",
  sold_out: "Sold out",
  ended: "Ended",
};

/** The sale's phase now, by the service's clock: its window first, then its
 *  stock (the service's own rule, GET /sales/{id} `status`). */
function phaseNow() {
  const sale = state.sale;
  if (!sale) return "loading";
  const now = clock.now();
  if (Number.isNaN(now)) return sale.status;
  if (sale.starts_at && now < parseTime(sale.starts_at)) return "not_started";
  if (sale.ends_at && now >= parseTime(sale.ends_at)) return "ended";
  return sale.remaining_stock > 0 ? "open" : "sold_out";
}

/** `ms` as `1 d 02:03:04`, `2:03:04` or `3:04`. */
function duration(ms) {
  let s = Math.max(0, Math.ceil(ms / 1000));
  const days = Math.floor(s / 86400); s %= 86400;
  const h = Math.floor(s / 3600); s %= 3600;
  const m = Math.floor(s / 60); s %= 60;
  const two = (n) => String(n).padStart(2, "0");
  const clockText = h > 0 || days > 0 ? `${days > 0 ? two(h) : h}:${two(m)}:${two(s)}` : `${m}:${two(s)}`;
  return days > 0 ? `${days} d ${clockText}` : clockText;
}

const count = new Intl.NumberFormat();

function render() {
  const sale = state.sale;
  const phase = phaseNow();
  el.status.textContent = PHASE_WORDS[phase] || phase;
  el.status.dataset.status = phase;
  if (sale) {
    el.name.textContent = sale.name;
    document.title = `${sale.name} — flash sale`;
    el.stock.textContent = `${count.format(sale.remaining_stock)} of ${count.format(sale.total_stock)} left`;
    el.stockBar.max = Math.max(1, sale.total_stock);
    el.stockBar.value = Math.max(0, sale.remaining_stock);
    el.sale.setAttribute("aria-busy", "false");
  }
  const now = clock.now();
  let countdown = "";
  if (phase === "not_started") countdown = `Starts in ${duration(parseTime(sale.starts_at) - now)}`;
  else if (phase === "open" && sale.ends_at) countdown = `Ends in ${duration(parseTime(sale.ends_at) - now)}`;
  el.countdown.textContent = countdown;
  el.countdown.hidden = countdown === "";
  const [enabled, words] = buyButton(phase);
  el.buy.disabled = !enabled;
  setText(el.buy, words);
  renderLine();
  if (state.shownPhase === "not_started" && phase === "open") refreshSoon(0);
  state.shownPhase = phase;
}

/** Whether the buy button is enabled in `phase`, and its words. */
function buyButton(phase) {
  if (state.buying) return [false, "Buying…"];
  if (state.done) return [false, "Bought"];
  // A waiting room takes its line before the start too: buyers are let in
  // from the start, in the order they joined.
  if (hasRoom() && (phase === "open" || phase === "not_started")) {
    switch (lineState()) {
      case "joining": return [false, "Joining the line…"];
      case "waiting": return [false, "Waiting for your turn…"];
      case "admitted": return [true, "Buy now"];
      case "sold_out": return [false, PHASE_WORDS.sold_out];
      case "expired": case "lost": return [true, "Join the line again"];
      default: return [true, "Join the line"];
    }
  }
  if (phase !== "open") return [false, PHASE_WORDS[phase]];
  return [true, "Buy now"];
}

/** Writes `text` only when it changed: a live region that is rewritten with
 *  the same words four times a second may be read out again each time. */
function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;
}

/** Shows an outcome of the purchase (`data-outcome` names it), or hides it. */
function showResult(outcome, text) {
  el.result.dataset.outcome = outcome || "";
  el.result.textContent = text || "";
  el.result.hidden = !outcome;
}

function hideNote() {
  el.note.hidden = true;
  el.note.dataset.kind = "";
  el.note.textContent = "";
}

/** Waits `ms` while a note of `kind` says why, its seconds counting down. */
async function waitWithNote(ms, kind, words) {
  const until = performance.now() + ms;
  el.note.dataset.kind = kind;
  el.note.hidden = false;
  for (;;) {
    const left = until - performance.now();
    if (left <= 0) break;
    el.note.textContent = words(Math.ceil(left / 1000));
    await sleep(Math.min(left, 250));
  }
}

// ---- Reading the sale ----------------------------------------------------
/** How long until the next read of the sale, by its phase; null: never. */
function nextReadMs(phase) {
  const sale = state.sale;
  if (phase === "ended") return null;
  if (phase === "sold_out") return 10000;
  if (phase === "not_started") {
    const untilStart = parseTime(sale.starts_at) - clock.now();
    return untilStart > 60000 ? 15000 : 2000;
  }
  return 2000;
}

function refreshSoon(ms) {
  clearTimeout(state.pollTimer);
  state.pollTimer = setTimeout(refresh, ms);
}

async function refresh() {
  clearTimeout(state.pollTimer);
  if (document.hidden) return; // read again when the tab is shown
  const sentAt = performance.now();
  let answer;
  try {
    answer = await api(`/sales/${state.saleId}`);
  } catch {
    state.readFailures += 1;
    refreshSoon(backoffMs(Math.min(state.readFailures, 5)));
    return;
  }
  const { response, body } = answer;
  if (response.status === 404) return fatal(`There is no sale number ${state.saleId}.`);
  if (!response.ok || !body) {
    state.readFailures += 1;
    refreshSoon(response.status === 503 ? retryAfterSeconds(response) * 1000 : backoffMs(Math.min(state.readFailures, 5)));
    return;
  }
  state.readFailures = 0;
  clock.sync(body.now, sentAt, performance.now());
  state.sale = body;
  render();
  const next = nextReadMs(phaseNow());
  if (next !== null) refreshSoon(next);
}

// ---- Buying ---------------------------------------------------------------
const MAX_RETRIES = 8;

async function buy() {
  if (state.buying || state.done) return;
  state.buying = true;
  showResult(null);
  render();
  try {
    await purchase();
  } finally {
    state.buying = false;
    hideNote();
    render();
  }
}

/** Sends the purchase until it has an outcome, retrying what may be retried. */
async function purchase() {
  let retries = 0;
  for (;;) {
    let answer;
    try {
      answer = await api(`/sales/${state.saleId}/orders`, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(purchaseBody()),
      });
    } catch {
      // No answer: the purchase may have been placed or not. Sending it again
      // is safe (see the top of this file).
      if (++retries > MAX_RETRIES) return failed("The store could not be reached. If your purchase went through, reloading the page shows it.");
      await waitWithNote(backoffMs(retries), "network", (s) => `Connection problem — trying again in ${s} s.`);
      continue;
    }
    const { response, body } = answer;
    hideNote();
    if (response.status === 201) return placed(body, "placed");
    if (response.status === 202) return queued(body);
    if (response.status === 409) return refused(problemKind(body), body);
    if (response.status === 401) return signInNeeded();
    if (response.status === 403) return admissionRefused(problemKind(body), body);
    if (response.status === 503 || response.status === 504) {
      if (++retries > MAX_RETRIES) return failed("The store is too busy right now. Please try again in a moment.");
      const busy = response.status === 503 && problemKind(body) === "busy";
      const ms = response.status === 503 ? retryAfterSeconds(response) * 1000 * (1 + Math.random() * 0.25) : backoffMs(retries);
      const kind = busy ? "busy" : response.status === 504 ? "timeout" : "unavailable";
      const why = busy ? "The sale is busy" : response.status === 504 ? "The store took too long to answer" : "The store is briefly unavailable";
      await waitWithNote(ms, kind, (s) => `${why} — trying again in ${s} s.`);
      continue;
    }
    return failed((body && (body.detail || body.title)) || `The store answered ${response.status}.`);
  }
}

/** The purchase's body: the buyer's, plus the admission when the waiting
 *  room let the buyer in — read at every attempt, so that a retry carries
 *  the token the line answered last. */
function purchaseBody() {
  const body = buyer.purchaseBody();
  const place = state.line;
  if (hasRoom() && place && place.state === "admitted") body.admission = place.admission;
  return body;
}

function placed(order, outcome) {
  state.done = true;
  stopPolling();
  writeStorage(pendingKey(), null);
  const units = order.quantity === 1 ? "1 unit" : `${order.quantity} units`;
  const text = outcome === "placed"
    ? `Order #${order.order_id} placed: ${units}. Thank you!`
    : `You already bought this: order #${order.order_id}, ${units}.`;
  showResult(outcome, text);
  refreshSoon(0);
}

function failed(text) {
  showResult("failed", text);
}

/** 401: this store checks who buys, and the page has no (valid) token. */
function signInNeeded() {
  writeStorage("seckill.token", null, sessionStorage);
  showResult("sign-in", buyer.signedIn
    ? "Your sign-in has expired. Sign in again to buy."
    : "Sign in to buy: this store needs to know who you are.");
}

/** A 409, or a settled request that was refused, in words. */
async function refused(kind, body) {
  writeStorage(pendingKey(), null);
  switch (kind) {
    case "sold-out":
      // The service just said so: show it now, before the next read confirms.
      if (state.sale) state.sale.remaining_stock = 0;
      if (hasRoom()) {
        stopPolling();
        state.line = { state: "sold_out" };
      }
      showResult("sold-out", "Sold out — every unit has been sold.");
      refreshSoon(0);
      return;
    case "already-purchased":
      return alreadyBought();
    case "not-started":
      showResult("not-started", "The sale has not started yet.");
      refreshSoon(0);
      return;
    case "ended":
      showResult("ended", "The sale has ended.");
      refreshSoon(0);
      return;
    default:
      failed((body && (body.detail || body.title)) || "The purchase was refused.");
  }
}

/** A 403: the sale has a waiting room and the purchase carried no admission,
 *  or one the service no longer takes (expired, already used). */
async function admissionRefused(kind, body) {
  if (kind !== "admission-required" && kind !== "admission-refused") {
    return failed((body && (body.detail || body.title)) || "The purchase was refused.");
  }
  // An earlier attempt whose answer was lost may have used the admission:
  // its order is then the outcome.
  try {
    const { response, body: order } = await api(buyer.orderPath(state.saleId));
    if (response.ok && order) return placed(order, "already-purchased");
  } catch { /* no answer: say what the refusal said */ }
  stopPolling();
  if (kind === "admission-required") {
    state.line = null;
    showResult("admission-refused", "This sale has a waiting room: join the line, and buy when it is your turn.");
  } else {
    state.line = { state: "expired" };
    showResult("admission-refused", "Your turn has passed — join the line again to buy.");
  }
}

/** The buyer holds an order already (an earlier attempt placed it): show it. */
async function alreadyBought() {
  state.done = true;
  try {
    const { response, body } = await api(buyer.orderPath(state.saleId));
    if (response.ok && body) return placed(body, "already-purchased");
  } catch { /* shown without its number below */ }
  showResult("already-purchased", "You already bought this.");
}

/** Where the page remembers a queued request, so that a reload resumes it. */
function pendingKey() { return `seckill.pending.${state.saleId}.${buyer.id}`; }

/** A 202: the request waits in the queue; poll its result. */
async function queued(accepted) {
  const location = accepted && accepted.location;
  if (typeof location !== "string" || !location.startsWith(`/sales/${state.saleId}/requests/`)) {
    return failed("The store accepted the purchase but did not say where its result will be.");
  }
  state.done = true;
  writeStorage(pendingKey(), location);
  return settle(location);
}

/** Polls a queued request (`wait_ms` holds each poll open up to 5 s) until
 *  it is settled. */
async function settle(location) {
  showResult("queued", "You're in the queue — your purchase is being settled…");
  let retries = 0;
  for (;;) {
    let answer;
    try {
      answer = await api(`${location}?wait_ms=5000`);
    } catch {
      retries += 1;
      await waitWithNote(backoffMs(Math.min(retries, 5)), "network", (s) => `Connection problem — asking again in ${s} s.`);
      continue;
    }
    const { response, body } = answer;
    hideNote();
    if (response.status === 200 && body) {
      switch (body.status) {
        case "pending": continue;
        case "placed": return placed(body, "placed");
        case "sold_out": state.done = false; return refused("sold-out", body);
        case "already_purchased": return refused("already-purchased", body);
        default:
          state.done = false;
          writeStorage(pendingKey(), null);
          return failed("Your purchase could not be settled. Please try again.");
      }
    }
    if (response.status === 404) {
      state.done = false;
      writeStorage(pendingKey(), null);
      return failed("The store does not know this purchase any more. Please try again.");
    }
    retries += 1;
    const ms = response.status === 503 ? retryAfterSeconds(response) * 1000 : backoffMs(Math.min(retries, 5));
    await waitWithNote(ms, "busy", (s) => `The store is busy — asking again in ${s} s.`);
  }
}

// ---- The waiting room ---------------------------------------------------------
// A sale with a waiting room admits its buyers from a line, in the order they
// joined, at its own pace: a purchase without an admission is refused (403).
// The page joins the line (POST /sales/{id}/line) and then asks for the
// buyer's place (GET /sales/{id}/line/{user}) every 500 ms: that is how the
// service knows the buyer is still there — a place not asked for in 10 s is
// given up — and how "sold out" reaches a waiting buyer within a second. The
// place is `waiting` (position, estimated wait, measured pace), `admitted`
// (a token valid until `expires_at`, which the purchase carries) or
// `sold_out`. The asking goes on while the tab is hidden: stopping would
// give the place up.

const LINE_POLL_MS = 500;
/** The longest pause between two asks for the place, whatever a failure or a
 *  503's Retry-After says: a longer one would give the place up. */
const LINE_MAX_PAUSE_MS = 4000;

const room = {
  timer: null,
  /** Bumped to stop the asking: an answer to an ask of an older round is
   *  dropped, so a stopped or restarted round never acts. */
  round: 0,
  failures: 0,
  /** The page joined again by itself after the service lost the place. */
  rejoined: false,
  resuming: false,
  /** The place may be rejoined by the page itself when lost: true after the
   *  buyer's own join and once an answer confirmed a place, false after an
   *  automatic rejoin until then — a service that keeps losing places is
   *  not joined in a loop. */
  confirmed: false,
};

/** Whether the sale has a waiting room (its document's `waiting_room`). */
function hasRoom() {
  return Boolean(state.sale) && state.sale.waiting_room != null;
}

function lineState() { return state.line ? state.line.state : ""; }

/** Milliseconds left of the buyer's turn by the service's clock (NaN when
 *  unknown). */
function turnLeftMs(place) {
  return parseTime(place.expires_at) - clock.now();
}

const LINE_WORDS = {
  "": "This sale has a waiting room: join the line (even before the start), and buy when it is your turn. Keep this page open while you wait.",
  joining: "Joining the line…",
  waiting: "You're in line. Keep this page open: it keeps your place.",
  rejoined: "Your place in line was lost, so you joined the line again. Keep this page open: it keeps your place.",
  admitted: "It's your turn! Buy before the time runs out.",
  expired: "Your turn has passed. Join the line again to buy.",
  lost: "Your place in line was lost. Join the line again to buy.",
  left: "You left the line.",
  sold_out: "The line is closed.",
};

const oneDecimal = new Intl.NumberFormat(undefined, { maximumFractionDigits: 1 });

/** An estimated wait in words: "about 3 s", "about 2 min". */
function waitWords(ms) {
  if (typeof ms !== "number" || !Number.isFinite(ms)) return "estimating…";
  if (ms < 1000) return "under a second";
  const s = Math.ceil(ms / 1000);
  if (s < 60) return `about ${s} s`;
  const minutes = Math.round(s / 60);
  if (minutes < 60) return `about ${minutes} min`;
  return `about ${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

/** The measured pace of admissions in words. */
function paceWords(perSecond) {
  if (typeof perSecond !== "number" || !Number.isFinite(perSecond)) return "measuring…";
  if (perSecond <= 0) return "nobody let in just now";
  if (perSecond < 1) return `1 buyer let in every ${oneDecimal.format(1 / perSecond)} s`;
  return `${oneDecimal.format(perSecond)} buyers let in a second`;
}

function renderLine() {
  const shown = hasRoom() && !state.done;
  el.line.hidden = !shown;
  if (!shown) return;
  const place = state.line;
  const kind = lineState();
  const waiting = kind === "waiting";
  const shownKind = waiting && room.rejoined ? "rejoined" : kind;
  el.line.dataset.state = shownKind;
  setText(el.lineStatus, LINE_WORDS[shownKind] || LINE_WORDS[""]);
  el.lineFacts.hidden = !waiting;
  if (waiting) {
    setText(el.position, count.format(place.position));
    const ahead = Number(place.ahead);
    setText(el.ahead, ahead > 0 ? ` — ${count.format(ahead)} ahead of you` : " — you're next");
    setText(el.wait, waitWords(place.estimated_wait_ms));
    setText(el.pace, paceWords(place.admissions_per_s));
  }
  let turn = "";
  if (kind === "admitted") {
    const left = turnLeftMs(place);
    if (!Number.isNaN(left)) turn = `Your turn: ${duration(left)} left to buy`;
  }
  setText(el.turn, turn);
  el.turn.hidden = turn === "";
  el.leave.hidden = !(waiting || kind === "admitted") || state.buying;
}

/** Four times a second: a turn that ran out ends, then the page is drawn. */
function tick() {
  const place = state.line;
  if (place && place.state === "admitted" && !state.buying && !state.done && turnLeftMs(place) <= 0) {
    stopPolling();
    state.line = { state: "expired" };
  }
  if (phaseNow() === "ended" && (lineState() === "waiting" || lineState() === "admitted")) {
    stopPolling();
    state.line = null;
  }
  render();
}

/** The button in a sale with a waiting room: join the line, or buy once
 *  admitted. */
function onBuyClick() {
  if (!hasRoom() || lineState() === "admitted") return buy();
  return joinLine(false);
}

/** Joins the line (`automatic`: again, after the service lost the place)
 *  and starts asking for the place. A join of a buyer already in line is
 *  answered with the place the buyer holds. */
async function joinLine(automatic) {
  if (lineState() === "joining" || state.buying || state.done) return;
  stopPolling();
  state.line = { state: "joining" };
  if (!automatic) showResult(null);
  render();
  let retries = 0;
  for (;;) {
    let answer;
    try {
      answer = await api(`/sales/${state.saleId}/line`, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(buyer.lineBody()),
      });
    } catch {
      if (++retries > MAX_RETRIES) return joinFailed("The store could not be reached. Please try again in a moment.");
      await waitWithNote(backoffMs(retries), "network", (s) => `Connection problem — trying again in ${s} s.`);
      continue;
    }
    const { response, body } = answer;
    hideNote();
    if (response.ok && body && typeof body.state === "string") {
      room.rejoined = automatic;
      room.confirmed = !automatic;
      takePlace(body);
      render();
      return;
    }
    if (response.status === 503 || response.status === 504) {
      if (++retries > MAX_RETRIES) return joinFailed("The store is too busy right now. Please try again in a moment.");
      const ms = response.status === 503 ? retryAfterSeconds(response) * 1000 * (1 + Math.random() * 0.25) : backoffMs(retries);
      const why = response.status === 503 ? "The line is busy" : "The store took too long to answer";
      await waitWithNote(ms, response.status === 503 ? "busy" : "timeout", (s) => `${why} — trying again in ${s} s.`);
      continue;
    }
    state.line = null;
    if (response.status === 409) await refused(problemKind(body), body);
    else if (response.status === 401) signInNeeded();
    else failed((body && (body.detail || body.title)) || `The store answered ${response.status}.`);
    render();
    return;
  }
}

function joinFailed(text) {
  state.line = null;
  failed(text);
  render();
}

/** A Place document the service answered: shown, and asked for again unless
 *  it is final. */
function takePlace(place) {
  if (place.state === "sold_out") {
    state.line = place;
    refused("sold-out");
    return;
  }
  state.line = place;
  if (place.state === "waiting" || place.state === "admitted") {
    if (!room.timer) startPolling();
  } else {
    stopPolling();
  }
}

function startPolling() {
  stopPolling();
  const round = room.round;
  room.failures = 0;
  room.timer = setTimeout(() => pollLine(round), LINE_POLL_MS);
}

function stopPolling() {
  room.round += 1;
  clearTimeout(room.timer);
  room.timer = null;
}

async function pollLine(round) {
  const sentAt = performance.now();
  let answer = null;
  try {
    answer = await api(buyer.linePath(state.saleId));
  } catch { /* no answer: asked again below */ }
  if (round !== room.round) return;
  const again = (ms) => { room.timer = setTimeout(() => pollLine(round), Math.min(LINE_MAX_PAUSE_MS, ms)); };
  const response = answer && answer.response;
  const body = answer && answer.body;
  if (response && response.status === 200 && body && typeof body.state === "string") {
    room.failures = 0;
    room.confirmed = true;
    takePlace(body);
    render();
    if (round === room.round) again(Math.max(0, LINE_POLL_MS - (performance.now() - sentAt)));
    return;
  }
  if (response && response.status === 404 && problemKind(body) === "not-in-line") {
    // A purchase in flight may have just used the admission, and with it the
    // place: its own answer tells.
    if (state.buying) return again(LINE_POLL_MS);
    return placeLost();
  }
  if (response && response.status === 401) {
    stopPolling();
    state.line = null;
    signInNeeded();
    render();
    return;
  }
  room.failures += 1;
  again(response && response.status === 503 ? retryAfterSeconds(response) * 1000 : backoffMs(Math.min(room.failures, 5)));
}

/** The service no longer knows the buyer's place: the turn ran out, or the
 *  place was given up (the page was not heard from for 10 s, e.g. a sleeping
 *  laptop) or lost (Redis restarted). The page joins again by itself, at the
 *  end of the line — once, until an answer confirms the new place. */
function placeLost() {
  stopPolling();
  const place = state.line;
  if (place && place.state === "admitted" && !(turnLeftMs(place) > 1000)) {
    state.line = { state: "expired" };
  } else if (room.confirmed) {
    joinLine(true);
    return;
  } else {
    state.line = { state: "lost" };
  }
  render();
}

/** Leaves the line; the place goes to the buyers behind. */
async function leaveLine() {
  stopPolling();
  state.line = { state: "left" };
  render();
  try {
    await api(buyer.linePath(state.saleId), { method: "DELETE" });
  } catch { /* no answer: the place lapses by itself once no longer asked for */ }
}

/** After a reload: a place the buyer holds (asked for within the last 10 s)
 *  is taken up again. */
async function resumeLine() {
  if (room.resuming) return;
  room.resuming = true;
  try {
    const { response, body } = await api(buyer.linePath(state.saleId));
    if (response.status === 200 && body && typeof body.state === "string" && !state.line) {
      room.confirmed = true;
      takePlace(body);
    }
  } catch { /* no answer: the buyer joins as if new */ }
  room.resuming = false;
  render();
}

// ---- Start ------------------------------------------------------------------
function fatal(text) {
  clearTimeout(state.pollTimer);
  el.sale.hidden = true;
  el.fatal.textContent = text;
  el.fatal.hidden = false;
  el.form.hidden = false;
}

/** The sale of this URL: `/sales/{id}`, or `/?sale={id}` (the form's). */
function saleIdFromUrl() {
  const path = location.pathname.match(/^\/sales\/(\d{1,19})\/?$/);
  if (path) return path[1];
  const query = new URLSearchParams(location.search).get("sale");
  return query && /^\d{1,19}$/.test(query.trim()) ? query.trim() : null;
}

async function start() {
  state.saleId = saleIdFromUrl();
  if (!state.saleId) {
    el.form.hidden = false;
    return;
  }
  if (location.pathname !== `/sales/${state.saleId}`) history.replaceState(null, "", `/sales/${state.saleId}`);
  el.saleNumber.value = state.saleId;
  el.sale.hidden = false;
  el.buyerId.textContent = String(buyer.id);
  el.buyerHow.textContent = buyer.signedIn ? ", signed in." : ", an id kept in this browser.";
  el.buy.addEventListener("click", onBuyClick);
  el.leave.addEventListener("click", leaveLine);
  document.addEventListener("visibilitychange", () => { if (!document.hidden) refreshSoon(0); });
  setInterval(tick, 250);
  state.starting = true;
  await refresh();
  state.starting = false;
  // Before the buyer's order and any queued request: a place still held is
  // taken up.
  if (hasRoom()) await resumeLine();
  // An earlier visit may have queued a purchase or bought already.
  const pending = readStorage(pendingKey());
  if (pending) {
    state.done = true;
    render();
    await settle(pending);
    render();
    return;
  }
  try {
    const { response, body } = await api(buyer.orderPath(state.saleId));
    if (response.ok && body) {
      state.done = true;
      placed(body, "already-purchased");
      render();
      return;
    }
  } catch { /* no answer: the buy button still tells the truth */ }
}

start();
