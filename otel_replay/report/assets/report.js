// otel-replay report pages: the one script, inlined and hashed into the page's Content-Security-Policy.
// It opens and closes the page's own sections, and lays out what a chain's event holds from the page's own
// JSON data block when the event is opened: every value goes in as text (textContent), never as markup.
// It makes no request.
(function () {
  "use strict";
  var data = null;
  function chainData() {
    if (data === null) {
      var block = document.getElementById("chain-data");
      data = block ? JSON.parse(block.textContent) : { details: {}, x: [], lane: [] };
    }
    return data;
  }
  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) { node.className = cls; }
    if (text !== undefined) { node.textContent = text; }
    return node;
  }
  // An event's body: its id, each section's fields, and the link to its own page (a path on the same server).
  function fill(event) {
    if (event.getAttribute("data-filled") !== null) { return; }
    event.setAttribute("data-filled", "");
    var held = chainData().details[event.id.slice(3)];
    if (!held) { return; }
    var body = el("div", "body");
    body.appendChild(el("p", "id", held[0]));
    held[2].forEach(function (section) {
      var box = el("div", "section");
      box.appendChild(el("h3", "", section[0]));
      if (section[2].length) {
        var list = el("dl", "facts");
        section[2].forEach(function (field) {
          list.appendChild(el("dt", "", field[0]));
          list.appendChild(el("dd", field[2] ? "changed" : "", field[1]));
        });
        box.appendChild(list);
      }
      if (section[1]) {
        var notes = el("ul", "notes");
        notes.appendChild(el("li", "", section[1]));
        box.appendChild(notes);
      }
      body.appendChild(box);
    });
    if (typeof held[1] === "string" && held[1].charAt(0) === "/" && held[1].charAt(1) !== "/") {
      var more = el("p");
      var link = el("a", "", "open the decision\u2019s causal tree");
      link.setAttribute("href", held[1]);
      more.appendChild(link);
      body.appendChild(more);
    }
    event.appendChild(body);
  }
  // An event that opens is a focusable line (tabindex): a click on it, or Enter or Space, opens or closes it.
  function show(event, open) {
    if (open) { fill(event); }
    event.classList.toggle("open", open);
    event.setAttribute("aria-expanded", open ? "true" : "false");
  }
  function openable(target) {
    var event = target instanceof Element ? target.closest(".event[tabindex]") : null;
    if (!event || target.closest(".body")) { return null; }  // inside what it holds: select, follow links
    return event;
  }
  document.addEventListener("click", function (e) {
    var event = openable(e.target);
    if (event) { show(event, !event.classList.contains("open")); }
  });
  document.addEventListener("keydown", function (e) {
    var event = openable(e.target);
    if (event && event === e.target && (e.key === "Enter" || e.key === " ")) {
      e.preventDefault();
      show(event, !event.classList.contains("open"));
    }
  });
  document.querySelectorAll("button[data-expand]").forEach(function (b) {
    b.addEventListener("click", function () {
      var expand = b.getAttribute("data-expand") === "all";
      document.querySelectorAll(".event[tabindex]").forEach(function (event) { show(event, expand); });
    });
  });
  // A click on a lane goes to that agent's event nearest the click on the time axis.
  document.querySelectorAll("svg[data-lane]").forEach(function (svg) {
    svg.addEventListener("click", function (e) {
      var box = svg.getBoundingClientRect();
      var at = ((e.clientX - box.left) / box.width * 1012 - 4) / 10;
      var d = chainData(), lane = Number(svg.getAttribute("data-lane")), best = -1, gap = Infinity;
      for (var i = 0; i < d.x.length; i++) {
        if (d.lane[i] === lane && Math.abs(d.x[i] - at) < gap) { gap = Math.abs(d.x[i] - at); best = i; }
      }
      if (best < 0) { return; }
      if (location.hash === "#ev-" + best) { fromHash(); } else { location.hash = "ev-" + best; }
    });
  });
  function fromHash() {
    var target = location.hash ? document.getElementById(location.hash.slice(1)) : null;
    if (target && target.matches(".event[tabindex]")) { show(target, true); }
  }
  window.addEventListener("hashchange", fromHash);
  fromHash();
  // Read the data block once the page is idle, so that the first event opened does not wait for it.
  if (document.getElementById("chain-data")) {
    if (window.requestIdleCallback) { window.requestIdleCallback(chainData); } else { setTimeout(chainData, 200); }
  }
})();
