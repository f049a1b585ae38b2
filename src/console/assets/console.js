// The ax console's only script: live updates (Server-Sent Events replace #live), the selection
// of the task list, and filters that apply on change. No build step, no dependencies.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var status = document.getElementById("live-status");
  var updates = 0;

  function selected() {
    return Array.prototype.slice.call(document.querySelectorAll("input.select:checked"));
  }

  function count() {
    var n = selected().length;
    var label = document.getElementById("selected-count");
    if (label) label.textContent = n + " selected";
    ["bulk-cancel", "bulk-retry"].forEach(function (id) {
      var b = document.getElementById(id);
      if (b) b.disabled = n === 0;
    });
  }

  function wire() {
    var all = document.getElementById("select-all");
    if (all) {
      all.addEventListener("change", function () {
        document.querySelectorAll("input.select").forEach(function (c) { c.checked = all.checked; });
        count();
      });
    }
    document.querySelectorAll("input.select").forEach(function (c) {
      c.addEventListener("change", count);
    });
    count();
  }

  if (live && window.EventSource) {
    var url = new URL(window.location.href);
    url.searchParams.delete("flash");
    url.searchParams.delete("token");
    var source = new EventSource("/events?view=" + encodeURIComponent(url.pathname + url.search));
    source.addEventListener("live", function (event) {
      var keep = {};
      selected().forEach(function (c) { keep[c.value] = true; });
      live.innerHTML = event.data;
      document.querySelectorAll("input.select").forEach(function (c) {
        if (keep[c.value]) c.checked = true;
      });
      updates += 1;
      document.body.setAttribute("data-live-updates", String(updates));
      wire();
    });
    source.onopen = function () {
      if (status) { status.className = "on"; status.textContent = "live"; }
    };
    source.onerror = function () {
      if (status) { status.className = "off"; status.textContent = "reconnecting…"; }
    };
  }

  var filters = document.getElementById("filters");
  if (filters) {
    filters.querySelectorAll("select").forEach(function (s) {
      s.addEventListener("change", function () { filters.submit(); });
    });
  }
  wire();
})();
