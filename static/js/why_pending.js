// "Why is this pending?" links (task page, triage rows): the assistant's answer loaded in place,
// below the link; a second click folds it. Without script the link opens the answer's own page.
// The answer says the reasons again, with Grid Engine's words and the facts behind them: while it is
// open it stands in for the page's own list of them (data-covers: that list's id), which is hidden,
// so that no reason is said twice; folding the answer shows the list again.
(function () {
  "use strict";
  function cover(link, on) {
    var list = document.getElementById(link.getAttribute("data-covers") || "");
    if (list) { list.hidden = on; }
  }
  document.addEventListener("click", function (e) {
    var link = e.target.closest ? e.target.closest("a.why-pending") : null;
    if (!link || e.ctrlKey || e.metaKey || e.shiftKey) { return; }
    var box = document.getElementById(link.getAttribute("data-target"));
    if (!box) { return; }
    e.preventDefault();
    if (!box.hidden && box.getAttribute("data-loaded")) {
      box.hidden = true; link.setAttribute("aria-expanded", "false"); cover(link, false); return;
    }
    box.hidden = false;
    box.className = "loading";
    box.textContent = "Asking the assistant…";
    var url = link.href + (link.href.indexOf("?") >= 0 ? "&" : "?") + "fragment=1";
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } }).then(function (r) {
      if (!r.ok) { throw new Error(r.status === 404 ? "that task is gone or not yours to see" : "HTTP " + r.status); }
      return r.text();
    }).then(function (html) {
      box.className = "";
      box.innerHTML = html;
      box.setAttribute("data-loaded", "1");
      link.setAttribute("aria-expanded", "true");
      cover(link, true);
    }).catch(function (err) {
      box.className = "inline-error";
      box.textContent = "No answer (" + err.message + "). Open the link for the answer's own page.";
    });
  });
})();
