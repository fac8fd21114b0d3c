// The urgent agents page: reloads the list of recent urgent agents every 2 s.
(function () {
  var box = document.getElementById("urgent-agents");
  if (!box) { return; }
  setInterval(function () {
    fetch(box.dataset.url, {credentials: "same-origin"}).then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) { if (html !== null) { box.innerHTML = html; } }).catch(function () {});
  }, 2000);
})();
