// otel-replay report pages: the one script, inlined and hashed into the page's Content-Security-Policy.
// It only opens and closes the page's own sections; it reads no data and makes no request.
(function () {
  "use strict";
  function all(open) {
    document.querySelectorAll("details.event").forEach(function (d) { d.open = open; });
  }
  document.querySelectorAll("button[data-expand]").forEach(function (b) {
    b.addEventListener("click", function () { all(b.getAttribute("data-expand") === "all"); });
  });
  if (location.hash) {
    var target = document.getElementById(location.hash.slice(1));
    if (target && target.tagName === "DETAILS") { target.open = true; }
  }
})();
