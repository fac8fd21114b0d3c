// The launch form: only the input box of the chosen input type is shown, and the chosen agent's
// example input can be copied into the parameter list. Without JavaScript every box is shown.
(function () {
  "use strict";
  const form = document.getElementById("launch-form");
  if (!form) return;
  const kinds = form.querySelectorAll('input[name="input_kind"]');
  const boxes = form.querySelectorAll(".input-box[data-kind]");
  function chosen() {
    const checked = form.querySelector('input[name="input_kind"]:checked');
    return checked ? checked.value : "params";
  }
  function showBoxes() {
    const kind = chosen();
    boxes.forEach(function (box) { box.hidden = box.dataset.kind !== kind; });
  }
  kinds.forEach(function (k) { k.addEventListener("change", showBoxes); });
  showBoxes();

  const examples = JSON.parse((document.getElementById("input-examples") || {}).textContent || "{}");
  const agent = form.querySelector('[name="agent_definition"]');
  const hint = document.getElementById("input-example");
  const params = form.querySelector('[name="input_params"]');
  function showExample() {
    const text = agent ? examples[agent.value] : "";
    if (!hint) return;
    hint.hidden = !text;
    hint.querySelector("code").textContent = text || "";
    if (params && text) params.placeholder = text;
  }
  if (agent) agent.addEventListener("change", showExample);
  showExample();
  const use = document.getElementById("use-example");
  if (use && params) {
    use.addEventListener("click", function () {
      params.value = examples[agent.value] || "";
      params.focus();
    });
  }
})();
