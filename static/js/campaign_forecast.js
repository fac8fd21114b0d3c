// Campaign page: the "Forecast and outcome" card follows the campaign. When the live counts the
// page's own socket redraws (#states) change, the card is fetched again as the server now sees it,
// at most once every few seconds; the counts themselves stay campaign.js's.
(function () {
  "use strict";
  var card = document.getElementById("forecast-outcome");
  var counts = document.querySelector("#states tbody");
  if (!card || !counts || !window.MutationObserver || !window.fetch) { return; }
  var url = card.getAttribute("data-url"), seen = counts.textContent, timer = null, GAP_MS = 3000;
  function refresh() {
    timer = null;
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } }).then(function (r) {
      return r.ok ? r.text() : "";
    }).then(function (html) {
      var box = document.createElement("div");
      box.innerHTML = html;
      var fresh = box.querySelector("#forecast-outcome");
      if (fresh) { card.replaceWith(fresh); card = fresh; }
    }).catch(function () { /* the next change asks again */ });
  }
  // The card is drawn from the database when the page is; the counts may come from a newer snapshot
  // (tasks running while the card still says "not started yet"): read it again once at the start.
  if (/not started yet|running$/m.test(card.textContent)) { timer = setTimeout(refresh, 1000); }
  new MutationObserver(function () {
    if (counts.textContent === seen) { return; }
    seen = counts.textContent;
    if (!timer) { timer = setTimeout(refresh, GAP_MS); }
  }).observe(counts, { childList: true, characterData: true, subtree: true });
})();
