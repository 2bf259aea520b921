(function () {
  "use strict";
  function key(tbody, col, type) {
    var cell = tbody.rows[0].cells[col];
    var v = cell.getAttribute("data-v");
    if (v === null) v = cell.textContent.trim();
    if (type === "num") { var x = parseFloat(v); return isNaN(x) ? null : x; }
    return v.toLowerCase();
  }
  function sortBy(th) {
    var table = th.closest("table"), col = th.cellIndex, type = th.getAttribute("data-type");
    var asc = th.getAttribute("aria-sort") !== "ascending";
    var bodies = Array.prototype.slice.call(table.tBodies);
    bodies.sort(function (a, b) {
      var x = key(a, col, type), y = key(b, col, type);
      if (x === y) return 0;
      if (x === null) return 1;  // missing values last either way
      if (y === null) return -1;
      return (x < y ? -1 : 1) * (asc ? 1 : -1);
    });
    bodies.forEach(function (b) { table.appendChild(b); });
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (c) { c.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", asc ? "ascending" : "descending");
  }
  document.querySelectorAll("table.sortable thead th").forEach(function (th) {
    th.addEventListener("click", function () { sortBy(th); });
  });
  var selects = document.querySelectorAll("select[data-filter]");
  function applyFilter() {
    var want = {};
    selects.forEach(function (s) { want[s.getAttribute("data-filter")] = s.value; });
    document.querySelectorAll("section.protocol").forEach(function (sec) {
      var shown = 0;
      sec.querySelectorAll("tbody.group").forEach(function (tb) {
        var ok = Object.keys(want).every(function (k) { return want[k] === "" || tb.dataset[k] === want[k]; });
        tb.hidden = !ok;
        shown += ok ? 1 : 0;
      });
      sec.hidden = shown === 0;
    });
    // a setting's heading is hidden with the last of its sections
    document.querySelectorAll("h2.setting").forEach(function (h) {
      var next = h.nextElementSibling, any = false;
      while (next && next.matches("section.protocol")) { any = any || !next.hidden; next = next.nextElementSibling; }
      h.hidden = !any;
    });
  }
  selects.forEach(function (s) { s.addEventListener("change", applyFilter); });
})();
