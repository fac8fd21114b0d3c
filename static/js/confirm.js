// Forms with data-confirm="question" ask before they submit (no inline handlers: the
// Content-Security-Policy allows scripts from this origin only).
document.addEventListener("submit", function (ev) {
  var form = ev.target;
  var question = form && form.getAttribute && form.getAttribute("data-confirm");
  if (question && !window.confirm(question)) { ev.preventDefault(); }
}, true);
