// Dismissible notices ("campaign finished"): a dismissed notice stays hidden in this browser
// (localStorage, keyed by campaign and finish time) until it ages out on the server.
(function () {
  "use strict";
  var KEY = "tco.dismissed-notices";
  function load() {
    try { return JSON.parse(window.localStorage.getItem(KEY) || "[]"); } catch (e) { return []; }
  }
  function save(list) {
    try { window.localStorage.setItem(KEY, JSON.stringify(list.slice(-200))); } catch (e) { /* private mode */ }
  }
  var dismissed = load();
  document.querySelectorAll("[data-notice]").forEach(function (item) {
    var id = item.getAttribute("data-notice");
    if (dismissed.indexOf(id) >= 0) { item.remove(); return; }
    var button = item.querySelector("button.dismiss");
    if (!button) return;
    button.addEventListener("click", function () {
      dismissed = load();
      if (dismissed.indexOf(id) < 0) dismissed.push(id);
      save(dismissed);
      item.remove();
    });
  });
  document.querySelectorAll("ul.notices").forEach(function (list) {
    if (!list.querySelector("li")) list.remove();
  });
})();
