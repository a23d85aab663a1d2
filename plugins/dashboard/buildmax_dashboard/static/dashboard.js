// BuildMax dashboard: live lease countdowns, and pages marked data-live
// refreshed every five seconds with their freshness shown. No inline
// script anywhere: the Content-Security-Policy allows this file only.
"use strict";

(function () {
  const REFRESH_MS = 5000;
  const LIVE_REFRESH_MS = 30000;
  let loadedAt = Date.now();
  let triedAt = loadedAt;

  function span(ms) {
    const s = Math.max(0, Math.round(ms / 1000));
    const m = Math.floor(s / 60);
    const h = Math.floor(m / 60);
    if (h > 0) return h + "h " + (m % 60) + "m";
    if (m > 0) return m + "m " + (s % 60) + "s";
    return s + "s";
  }

  function countdowns() {
    const now = Date.now();
    document.querySelectorAll("time[data-lease]").forEach(function (el) {
      const at = Date.parse(el.getAttribute("datetime"));
      if (Number.isNaN(at)) return;
      const left = at - now;
      el.textContent = left > 0 ? "expires in " + span(left) : "lapsed " + span(-left) + " ago";
      el.classList.toggle("lapsed", left <= 0);
    });
    const fresh = document.getElementById("freshness");
    if (fresh && document.querySelector("main[data-live]")) {
      const main = document.querySelector("main[data-live]");
      fresh.textContent = "Updated " + span(now - loadedAt) + " ago" +
        (busy(main) ? " · paused while you edit" : live ? " · live" : " · refreshing every 5 s");
    }
  }

  // Nothing typed is lost: while a field of the page has focus or holds
  // what the person typed, the page is not replaced (it catches up after).
  let typing = false;

  function busy(main) {
    const active = document.activeElement;
    return typing || main.querySelector("details.move[open]") !== null ||
      (active && main.contains(active) && active.matches("input, select, textarea"));
  }

  async function refresh() {
    const main = document.querySelector("main[data-live]");
    if (!main || document.hidden) return;
    triedAt = Date.now();
    if (busy(main)) return;
    try {
      const answer = await fetch(window.location.href, {
        credentials: "same-origin",
        headers: { "Accept": "text/html" },
        redirect: "manual",
      });
      if (!answer.ok) return;
      const page = new DOMParser().parseFromString(await answer.text(), "text/html");
      const fresh = page.querySelector("main[data-live]");
      if (!fresh) return;
      const focused = document.activeElement && document.activeElement.id;
      if (busy(main)) return;
      main.replaceChildren(...fresh.childNodes);
      if (focused) {
        const again = document.getElementById(focused);
        if (again) again.focus();
      }
      loadedAt = Date.now();
      draggable();
      countdowns();
    } catch (err) {
      // The server is away: the freshness line keeps counting up.
    }
  }

  // A page of one space listens to that space's events and refreshes as
  // soon as something happens; while the stream is down (or on a page of
  // several spaces) it refreshes every five seconds.
  let live = false;
  let pending = null;

  function soon() {
    if (pending === null) {
      pending = window.setTimeout(function () { pending = null; refresh(); }, 150);
    }
  }

  function listen(url) {
    const source = new EventSource(url, { withCredentials: true });
    source.addEventListener("open", function () { live = true; });
    source.addEventListener("changed", soon);
    source.addEventListener("error", function () { live = false; });
    source.addEventListener("access-ended", function () { live = false; source.close(); });
  }

  // The review form: a "+" on a diff line adds a finding on that line;
  // "Add a finding" adds an empty one. Without script, one empty row.
  function findingRow() {
    const rows = document.querySelectorAll("#findings-rows .finding-row");
    const last = rows[rows.length - 1];
    const used = Array.from(last.querySelectorAll("input")).some(function (i) { return i.value; });
    if (!used) return last;
    const fresh = last.cloneNode(true);
    fresh.querySelectorAll("input").forEach(function (i) { i.value = ""; });
    last.after(fresh);
    return fresh;
  }

  function reviewForm() {
    if (!document.getElementById("findings-rows")) return;
    document.querySelectorAll("button.add-finding, #add-finding-row").forEach(function (b) {
      b.hidden = false;
    });
    document.getElementById("add-finding-row").addEventListener("click", function () {
      findingRow().querySelector("input[name=finding_path]").focus();
    });
    document.addEventListener("click", function (event) {
      const button = event.target.closest("button.add-finding");
      if (!button) return;
      const row = findingRow();
      row.querySelector("input[name=finding_path]").value = button.dataset.path;
      row.querySelector("input[name=finding_line]").value = button.dataset.line;
      row.querySelector("input[name=finding_text]").focus();
    });
  }

  // The board: a card with a Move menu may be dragged onto a column its
  // menu offers; the drop takes that move's form (asking for its reason
  // first, if it needs one). The menu is the keyboard's way to the same.
  function boardMoves() {
    let dragged = null;
    document.addEventListener("dragstart", function (event) {
      const card = event.target.closest && event.target.closest("li.card");
      if (!card || !card.querySelector("form[data-to]")) return;
      dragged = card;
      event.dataTransfer.setData("text/plain", card.dataset.task);
      event.dataTransfer.effectAllowed = "move";
    });
    function target(event) {
      const column = event.target.closest && event.target.closest("section.column[data-state]");
      if (!column || !dragged) return null;
      return dragged.querySelector('form[data-to="' + column.dataset.state + '"]');
    }
    document.addEventListener("dragover", function (event) {
      if (target(event)) event.preventDefault();
    });
    document.addEventListener("drop", function (event) {
      const form = target(event);
      dragged = null;
      if (!form) return;
      event.preventDefault();
      const needed = form.querySelector("input[required]");
      if (needed && !needed.value) {
        form.closest("details").open = true;
        needed.focus();
        return;
      }
      form.requestSubmit();
    });
    draggable();
  }

  function draggable() {
    document.querySelectorAll("li.card").forEach(function (card) {
      if (card.querySelector("form[data-to]")) card.draggable = true;
    });
  }

  // The catalog's publish form: the archive goes as the request's body
  // (with the form's CSRF token in a header), and the bar shows how much
  // of it has been sent. The answer is the plugin's page, or a refusal
  // whose words are shown here.
  function publishForm() {
    const form = document.getElementById("publish-form");
    if (!form) return;
    const bar = document.getElementById("p-progress");
    const status = document.getElementById("p-status");
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      const file = form.querySelector("input[type=file]").files[0];
      const name = form.querySelector("input[name=name]").value;
      if (!file) return;
      const request = new XMLHttpRequest();
      request.open("POST", form.action + "?name=" + encodeURIComponent(name));
      request.setRequestHeader("X-CSRF-Token", form.dataset.csrf);
      request.setRequestHeader("Content-Type", "application/octet-stream");
      request.responseType = "document";
      bar.hidden = false;
      bar.value = 0;
      status.textContent = "Uploading " + file.name + "…";
      request.upload.addEventListener("progress", function (p) {
        if (p.lengthComputable) {
          bar.value = Math.round((100 * p.loaded) / p.total);
          status.textContent = "Uploading " + file.name + ": " + bar.value + "%";
        }
      });
      request.upload.addEventListener("load", function () {
        status.textContent = "Uploaded; the server is checking the archive…";
      });
      request.addEventListener("load", function () {
        if (request.status === 200 && request.responseURL.indexOf("/ui/catalog/") !== -1) {
          window.location.assign(request.responseURL);
          return;
        }
        const main = request.response && request.response.querySelector("main");
        const words = main ? main.textContent.replace(/\s+/g, " ").trim() : "";
        status.textContent = "Not published (" + request.status + "): " + words;
        status.classList.add("problem");
      });
      request.addEventListener("error", function () {
        status.textContent = "The upload failed: the server could not be reached.";
        status.classList.add("problem");
      });
      request.send(file);
    });
  }

  // A new secret's Copy button (shown where the clipboard can be written).
  function copyButtons() {
    document.querySelectorAll("button.copy[data-copy]").forEach(function (button) {
      if (!navigator.clipboard) return;
      button.hidden = false;
      button.addEventListener("click", async function () {
        const field = document.getElementById(button.dataset.copy);
        try {
          await navigator.clipboard.writeText(field.value);
          button.textContent = "Copied";
        } catch (err) {
          field.select();
          button.textContent = "Copy it by hand (selected)";
        }
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    const liveMain = document.querySelector("main[data-live]");
    if (liveMain) {
      liveMain.addEventListener("input", function () {
        typing = Array.from(liveMain.querySelectorAll("input, textarea")).some(function (field) {
          if (field.type === "checkbox" || field.type === "radio") {
            return field.checked !== field.defaultChecked;
          }
          return field.type !== "hidden" && field.value !== field.defaultValue;
        });
      });
    }
    reviewForm();
    boardMoves();
    publishForm();
    copyButtons();
    const main = document.querySelector("main[data-live]");
    if (main && main.dataset.events && window.EventSource) listen(main.dataset.events);
    countdowns();
    window.setInterval(countdowns, 1000);
    // Live pages still refresh now and then: some things change with time
    // alone (a lease running out, review work waiting too long).
    window.setInterval(function () {
      if (Date.now() - triedAt >= (live ? LIVE_REFRESH_MS : REFRESH_MS)) refresh();
    }, 1000);
  });
})();
