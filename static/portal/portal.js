/* Progressive enhancement only: every page works without this file.
   - countdowns: <time datetime=... data-countdown> ticks m:ss every second,
     corrected for the difference between the server's clock and this one;
   - copy buttons: [data-copy=<id>] copies that element's text;
   - htmx errors other than a handled 409 become a message on the page. */
(function () {
  "use strict";
  document.documentElement.classList.replace("no-js", "js");

  var serverNow = Date.parse(document.body.getAttribute("data-server-now") || "");
  var skew = isNaN(serverNow) ? 0 : serverNow - Date.now();

  function pad(n) { return n < 10 ? "0" + n : String(n); }

  function tick() {
    var now = Date.now() + skew;
    document.querySelectorAll("[data-countdown]").forEach(function (el) {
      var until = Date.parse(el.getAttribute("datetime"));
      if (isNaN(until)) { return; }
      var left = Math.max(0, Math.ceil((until - now) / 1000));
      el.textContent = Math.floor(left / 60) + ":" + pad(left % 60);
      el.classList.toggle("expired", left === 0);
    });
  }
  tick();
  setInterval(tick, 1000);
  document.body.addEventListener("htmx:afterSettle", tick);

  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-copy]");
    if (!button) { return; }
    var source = document.getElementById(button.getAttribute("data-copy"));
    if (!source) { return; }
    var text = source.innerText.trim();
    var done = function () {
      var label = button.textContent;
      button.textContent = "Copied";
      setTimeout(function () { button.textContent = label; }, 1500);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done);
    } else {
      var range = document.createRange();
      range.selectNodeContents(source);
      var selection = window.getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
      document.execCommand("copy");
      done();
    }
  });

  function say(text) {
    var list = document.getElementById("messages");
    if (!list) { return; }
    var item = document.createElement("li");
    item.className = "error";
    item.setAttribute("role", "alert");
    item.textContent = text;
    list.replaceChildren(item);
  }
  document.body.addEventListener("htmx:responseError", function (event) {
    var status = event.detail.xhr.status;
    say(status === 403 || status === 404
      ? "That is not yours, or it no longer exists. Reload the page."
      : "The server could not do that (" + status + "). Reload the page and try again.");
  });
  document.body.addEventListener("htmx:sendError", function () {
    say("The server cannot be reached; the page stops updating until it can. Reload to try again.");
  });
})();
