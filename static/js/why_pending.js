// "Why is this pending?" links (task page, triage rows): the assistant's answer loaded in place,
// below the link; a second click folds it. Without script the link opens the answer's own page.
(function () {
  "use strict";
  document.addEventListener("click", function (e) {
    var link = e.target.closest ? e.target.closest("a.why-pending") : null;
    if (!link || e.ctrlKey || e.metaKey || e.shiftKey) { return; }
    var box = document.getElementById(link.getAttribute("data-target"));
    if (!box) { return; }
    e.preventDefault();
    if (!box.hidden && box.getAttribute("data-loaded")) {
      box.hidden = true; link.setAttribute("aria-expanded", "false"); return;
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
    }).catch(function (err) {
      box.className = "inline-error";
      box.textContent = "No answer (" + err.message + "). Open the link for the answer's own page.";
    });
  });
})();
