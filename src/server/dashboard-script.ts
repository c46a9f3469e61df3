/**
 * The dashboard's script, served as /dashboard.js (the page's CSP allows no inline script).
 * Plain browser JavaScript, no framework: it polls `v1/dashboard` every 1.5 s with the read
 * token from session storage and draws each panel anew with DOM calls only — text goes in as
 * text nodes and attribute values, never through innerHTML — because names, keys, holders,
 * application names and errors are anyone's input.
 *
 * Kept as a string (String.raw, so its backslashes stay as written; it uses no backticks).
 */
export const DASHBOARD_SCRIPT = String.raw`'use strict';
(function () {
  var TOKEN_KEY = 'ordo.dashboard.token';
  var POLL_MS = 1500;
  var SVG_NS = 'http://www.w3.org/2000/svg';
  var MAX_SAFE = 9007199254740991;
  var REASONS = {
    every: 'every: one start per interval',
    rate: 'rate: the bucket was empty',
    concurrency: 'concurrency: every slot running',
    paused: 'paused',
    queued: 'queued: others were waiting first',
  };
  var RESETS = { day: 'daily', week: 'weekly', month: 'monthly', year: 'yearly' };
  /**
   * An appender open this briefly is a commit on its way, not one holding messages back: on a
   * busy topic one is caught at almost every reading. Counted among the open appenders only.
   */
  var BLOCKER_AFTER_MS = 1000;

  var meta = document.querySelector('meta[name="ordo-auth"]');
  var needsToken = meta !== null && meta.getAttribute('content') === 'bearer';
  var status = document.getElementById('status');
  var notice = document.getElementById('notice');
  var login = document.getElementById('login');
  var tokenInput = document.getElementById('token');
  var forget = document.getElementById('forget');
  var panels = document.getElementById('panels');
  var footer = document.getElementById('footer');
  /** <details> the reader opened, by key, kept open across redraws. */
  var opened = new Set();
  var timer = 0;
  /** Bumped when the token changes: an answer to an older request is dropped. */
  var generation = 0;
  var numbers = new Intl.NumberFormat();

  // ---- building DOM: text is always text ----------------------------------------------------

  function h(tag, attrs) {
    var el = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (name) {
        var v = attrs[name];
        if (v === undefined || v === null || v === false) return;
        if (name === 'class') el.className = v;
        else el.setAttribute(name, v === true ? '' : String(v));
      });
    }
    for (var i = 2; i < arguments.length; i++) add(el, arguments[i]);
    return el;
  }
  function add(el, child) {
    if (child === undefined || child === null || child === false) return;
    if (Array.isArray(child)) child.forEach(function (c) { add(el, c); });
    else el.append(child instanceof Node ? child : String(child));
  }
  function tag(text, tone) {
    return h('span', { class: 'tag' + (tone ? ' ' + tone : '') }, text);
  }
  function quoted(text) {
    return '\u201c' + text + '\u201d';
  }
  function facts(pairs) {
    var dl = h('dl', { class: 'facts' });
    pairs.forEach(function (p) {
      if (p) add(dl, [h('dt', null, p[0]), h('dd', null, p[1])]);
    });
    return dl;
  }
  /** A table whose cells carry their column's name, shown beside the value on a phone. */
  function table(caption, columns, rows, empty) {
    if (rows.length === 0) return h('p', { class: 'empty' }, empty);
    var classes = columns.map(function (c) {
      return [c.num ? 'num' : '', c.short ? 'short' : ''].join(' ').trim() || null;
    });
    var head = h('tr', null, columns.map(function (c, i) {
      return h('th', { scope: 'col', class: classes[i] }, c.label);
    }));
    var body = h('tbody', null, rows.map(function (cells) {
      return h('tr', null, cells.map(function (cell, i) {
        return h('td', { 'data-label': columns[i].label, class: classes[i] }, cell);
      }));
    }));
    return h('div', { class: 'table-wrap' },
      h('table', { class: 'stack' }, h('caption', null, caption), h('thead', null, head), body));
  }
  /** A line of rates over the window; the caption says the same in words. */
  function sparkline(values, what, windowMs) {
    var known = values.filter(function (v) { return v !== null; });
    var peak = known.length ? Math.max.apply(null, known) : 0;
    var width = 120;
    var height = 24;
    var step = values.length > 1 ? width / (values.length - 1) : width;
    var d = '';
    values.forEach(function (v, i) {
      if (v === null) return;
      var x = i * step;
      var y = (height - 1 - (peak > 0 ? (v / peak) * (height - 2) : 0)).toFixed(1);
      var joined = i > 0 && values[i - 1] !== null;
      var alone = !joined && (i + 1 >= values.length || values[i + 1] === null);
      // A reading between two gaps is a short dash, so that it shows at all.
      if (alone) d += 'M' + Math.max(0, x - step / 2).toFixed(1) + ' ' + y + 'L' + x.toFixed(1) + ' ' + y + ' ';
      else d += (joined ? 'L' : 'M') + x.toFixed(1) + ' ' + y + ' ';
    });
    var minutes = Math.round(windowMs / 60000);
    var caption = known.length === 0
      ? 'no readings in the last ' + minutes + ' min'
      : 'last ' + minutes + ' min, peak ' + rate(peak);
    var svg = document.createElementNS(SVG_NS, 'svg');
    svg.setAttribute('class', 'spark');
    svg.setAttribute('viewBox', '0 0 ' + width + ' ' + height);
    svg.setAttribute('preserveAspectRatio', 'none');
    svg.setAttribute('role', 'img');
    svg.setAttribute('aria-label', what + ': ' + caption);
    var path = document.createElementNS(SVG_NS, 'path');
    path.setAttribute('d', d.trim() || 'M0 ' + (height - 1));
    svg.append(path);
    return h('div', { class: 'spark-row' }, svg, h('span', { class: 'spark-caption', 'aria-hidden': 'true' }, caption));
  }

  // ---- words for numbers and times ----------------------------------------------------------

  function num(n) {
    return n === null || n === undefined ? '\u2013' : numbers.format(n);
  }
  function rate(n) {
    if (n === null || n === undefined) return 'no rate yet';
    if (n === 0) return '0/s';
    return (n >= 10 ? numbers.format(Math.round(n)) : n.toFixed(1)) + '/s';
  }
  function duration(ms) {
    if (ms === null || ms === undefined) return '\u2013';
    var s = ms / 1000;
    if (s < 10) return s.toFixed(1) + ' s';
    if (s < 60) return Math.floor(s) + ' s';
    var m = Math.floor(s / 60);
    if (m < 60) return m + ' min' + (Math.floor(s % 60) ? ' ' + Math.floor(s % 60) + ' s' : '');
    var hours = Math.floor(m / 60);
    if (hours < 48) return hours + ' h' + (m % 60 ? ' ' + (m % 60) + ' min' : '');
    return Math.floor(hours / 24) + ' d' + (hours % 24 ? ' ' + (hours % 24) + ' h' : '');
  }
  /** How long before the snapshot's time (the server's clock, not this browser's). */
  function ago(iso, now) {
    return iso ? duration(Math.max(0, now - Date.parse(iso))) + ' ago' : 'never';
  }
  function left(iso, now) {
    return iso ? duration(Math.max(0, Date.parse(iso) - now)) + ' left' : '';
  }
  function clock(iso) {
    return new Date(iso).toLocaleTimeString();
  }
  function scopeText(scope) {
    return scope === '' ? '(no scope)' : scope;
  }
  function transaction(t) {
    if (t.pid === null) return 'prepared transaction ' + quoted(t.preparedGid || '?') + ' (COMMIT PREPARED or ROLLBACK PREPARED it)';
    var parts = ['pid ' + t.pid];
    parts.push(t.applicationName ? 'application ' + quoted(t.applicationName) : 'no application name');
    if (t.state) parts.push(t.state);
    return parts.join(' \u00b7 ');
  }

  // ---- panels -------------------------------------------------------------------------------

  function describeSequence(s) {
    var parts = [];
    if (s.kind === 'batched') {
      parts.push('ranges of ' + num(s.batch) + ' per node');
      parts.push('from ' + num(s.start));
      if (s.increment !== 1) parts.push('step ' + num(s.increment));
      parts.push(s.timeoutMs === null ? 'no timeout' : 'timeout ' + duration(s.timeoutMs));
    } else {
      parts.push('from ' + num(s.start));
      if (s.increment !== 1) parts.push('step ' + num(s.increment));
      if (s.reset === 'never') parts.push('never resets');
      else parts.push('resets ' + (RESETS[s.reset] || s.reset) + ' in ' + s.timeZone +
        (s.reset === 'year' && s.yearStart !== 1 ? ' (years from month ' + s.yearStart + ')' : ''));
      if (s.format) parts.push('format ' + s.format);
    }
    if (s.maxValue !== MAX_SAFE) parts.push('up to ' + num(s.maxValue));
    if (s.cycle) parts.push('cycles');
    return parts.join(' \u00b7 ');
  }

  function sequenceCard(s, snap) {
    var now = Date.parse(snap.at);
    var gapless = s.kind === 'gapless';
    var card = h('article', { class: 'card', 'data-sequence': s.name },
      h('h3', null, s.name, tag(s.kind),
        s.holders.length ? tag('held by ' + s.holders.length + ' open transaction' + (s.holders.length > 1 ? 's' : ''), 'warn') : null),
      h('p', { class: 'def' }, describeSequence(s)),
      facts([
        [gapless ? 'Issued' : 'Reserved', [h('strong', null, rate(s.perSecond)), ' \u00b7 ', num(s.taken) + ' in all',
          gapless ? '' : ' (ranges, every node)']],
      ]),
      sparkline(s.history, 'Values ' + (gapless ? 'issued' : 'reserved') + ' per second', snap.windowMs));
    if (gapless) {
      add(card, table('Current value per scope and period, the busiest first',
        [{ label: 'Scope' }, { label: 'Period', short: true }, { label: 'Value', num: true }, { label: 'Rate', num: true },
          { label: 'Last taken', short: true }],
        s.counters.map(function (c) {
          return [scopeText(c.scope), c.period || 'all time', num(c.value), rate(c.perSecond), ago(c.updatedAt, now)];
        }),
        'No value issued yet.'));
      if (s.moreCounters > 0) add(card, h('p', { class: 'more' }, 'and ' + num(s.moreCounters) + ' quieter counters'));
      add(card, table('Counters held by an open transaction',
        [{ label: 'Scope' }, { label: 'Period', short: true }, { label: 'Held by' }, { label: 'Open for', short: true },
          { label: 'Waiting', num: true }],
        s.holders.map(function (t) {
          return [scopeText(t.scope), t.period || 'all time', transaction(t), duration(t.openForMs), num(t.waiting)];
        }),
        'No counter is held by an open transaction.'));
    } else {
      add(card, table('Ranges held by each node',
        [{ label: 'Node' }, { label: 'Range', short: true }, { label: 'Used' }, { label: 'Reserved', short: true }],
        s.ranges.map(function (r) {
          var used = r.used === null
            ? 'not known here (that node counts in its memory)'
            : [h('meter', { min: 0, max: r.size, value: r.used, 'aria-hidden': 'true' }),
               num(r.used) + ' of ' + num(r.size) + ' (' + Math.round((100 * r.used) / r.size) + '%)'];
          return [[h('span', { class: 'mono' }, r.nodeId.slice(0, 8)), r.thisNode ? ' (this server)' : ''],
            num(r.first) + '\u2013' + num(r.last), used, ago(r.reservedAt, now)];
        }),
        'No node holds a range.'));
    }
    return card;
  }

  function subscriptionCard(s, snap) {
    var now = Date.parse(snap.at);
    // Lag counts committed messages only, and an open transaction holds back its own messages,
    // nothing committed (delivery is in commit order). So a subscription waits for the open
    // transaction when every committed message is delivered and the transaction appended to its
    // topic (and has been open for a while); one that is behind is behind for its consumer's
    // sake, whatever is open.
    var blocker = s.blockedBy !== null && !(s.blockedBy.openForMs !== null && s.blockedBy.openForMs < BLOCKER_AFTER_MS)
      ? s.blockedBy : null;
    var waitsForIt = blocker !== null && s.messagesBehind === 0;
    var state = s.messagesBehind > 0
      ? tag('behind', 'warn')
      : waitsForIt ? tag('waiting for an open transaction', 'warn') : tag('up to date', 'good');
    var card = h('article', { class: 'card', 'data-subscription': s.name },
      h('h3', null, s.name, state,
        s.relay ? tag('relay to ' + s.relay.broker, s.relay.state === 'stopped' ? null : 'good') : null,
        s.attempts > 0 || (s.relay && s.relay.state === 'failing') ? tag('failing', 'bad') : null,
        s.deadLettered > 0 ? tag(num(s.deadLettered) + ' dead', 'warn') : null),
      h('p', { class: 'def' }, 'topic ' + s.topic + (s.partitions.length > 1 ? ' \u00b7 ' + s.partitions.length + ' partitions' : '') +
        (s.relay ? ' \u00b7 ' + s.relay.target : '')),
      facts([
        ['Lag', num(s.messagesBehind) + ' message' + (s.messagesBehind === 1 ? '' : 's')],
        ['Oldest', s.oldestAgeMs === null ? 'none waiting' : duration(s.oldestAgeMs) + ' old'],
        ['Delivered', [h('strong', null, rate(s.deliveredPerSecond)), ' \u00b7 ', num(s.delivered) + ' in all',
          s.redelivered ? ' \u00b7 ' + num(s.redelivered) + ' again' : '']],
        ['Dead letters', num(s.deadLettered)],
        ['Consumer', s.owner ? [s.owner, ' (lease: ', left(s.leaseUntil, now), ')'] : 'none holds the lease'],
        s.attempts > 0 ? ['Failing', 'attempt ' + s.attempts + (s.lastError ? ': ' + s.lastError : '')] : null,
        // A broker away is retried without counting attempts: the relay's own last error says why.
        s.relay && s.relay.state === 'failing' && s.relay.lastRelayError
          ? ['Broker', [s.relay.lastRelayError, ' (' + ago(s.relay.lastRelayErrorAt, now) + ')']] : null,
        s.relay && s.relay.state === 'stopped' ? ['Relay', 'no process runs it'] : null,
        s.waiting > 0 ? ['Open appenders', num(s.waiting) + ' open transaction' + (s.waiting === 1 ? '' : 's') + ' appended to the topic'] : null,
      ]));
    if (blocker) {
      var b = blocker;
      add(card, h('div', { class: 'blocker' + (waitsForIt ? ' holding' : ''), 'data-blocker': waitsForIt ? 'holding' : 'open' },
        h('p', null, h('strong', null, waitsForIt
          ? 'Its next messages are held back by an open transaction: '
          : 'An open transaction appended to the topic: '), transaction(b)),
        h('p', null, 'open for ' + duration(b.openForMs) + ' \u00b7 ' + num(b.xidAge) + (b.xidAge === 1 ? ' transaction' : ' transactions') + ' begun since'),
        h('p', { class: 'def' }, waitsForIt
          ? 'Every committed message is delivered; its messages come once it commits.'
          : 'Its messages come once it commits; the ' + num(s.messagesBehind) + ' behind are committed and wait for the consumer, not for it.')));
    }
    add(card, sparkline(s.history, 'Messages delivered per second', snap.windowMs));
    if (s.partitions.length > 1) {
      add(card, table('Partitions',
        [{ label: 'Partition', num: true }, { label: 'Lag', num: true }, { label: 'Oldest', short: true },
          { label: 'Delivery', num: true }, { label: 'Consumer' }],
        s.partitions.map(function (p) {
          return [String(p.partition), num(p.messagesBehind), p.oldestAgeMs === null ? 'none' : duration(p.oldestAgeMs),
            rate(p.deliveredPerSecond), p.owner || 'none'];
        }), ''));
    }
    if (s.deadLettered > 0) {
      var key = 'dead:' + s.name;
      var details = h('details', { open: opened.has(key) },
        h('summary', null, 'Latest dead letters (' + num(s.deadLetters.length) + ' of ' + num(s.deadLettered) + ')'),
        h('ol', { class: 'letters' }, s.deadLetters.map(function (d) {
          return h('li', null,
            h('p', null, h('strong', null, d.type), ' \u00b7 position ' + d.position +
              (d.key !== null ? ' \u00b7 key ' + quoted(d.key) : '') +
              (d.messageId !== null ? ' \u00b7 id ' + quoted(d.messageId) : '') +
              ' \u00b7 ' + d.attempts + (d.attempts === 1 ? ' attempt' : ' attempts') + ' \u00b7 parked ' + ago(d.parkedAt, now)),
            h('p', null, 'Error: ', d.error === null ? 'none recorded' : d.error),
            h('p', { class: 'mono' }, d.data));
        })));
      details.addEventListener('toggle', function () {
        if (details.open) opened.add(key);
        else opened.delete(key);
      });
      add(card, details);
    }
    return card;
  }

  function describeThrottle(t) {
    var parts = [];
    if (t.everyMs !== null) parts.push('one start every ' + duration(t.everyMs));
    if (t.limit !== null) parts.push(num(t.limit) + ' starts per ' + duration(t.perMs));
    if (t.concurrency !== null) parts.push('at most ' + num(t.concurrency) + ' running');
    parts.push('per key');
    if (t.leaseMs === null) parts.push('starts only, no permits');
    else {
      parts.push('lease ' + duration(t.leaseMs));
      parts.push(t.refundOnFailure ? 'a failure gives its start back' : 'a failure counts');
    }
    return parts.join(' \u00b7 ');
  }

  function throttleCard(t, snap) {
    var now = Date.parse(snap.at);
    var refused = Object.keys(REASONS).reduce(function (n, r) { return n + t.counts.refused[r]; }, 0);
    var card = h('article', { class: 'card', 'data-throttle': t.name },
      h('h3', null, t.name,
        t.pausedUntil ? tag('paused', 'warn') : t.runningCount > 0 ? tag(num(t.runningCount) + ' running', 'good') : tag('idle'),
        refusedRate(t) ? tag('refusing', 'warn') : null),
      h('p', { class: 'def' }, describeThrottle(t)),
      facts([
        t.pausedUntil ? ['Paused', 'until ' + clock(t.pausedUntil) + ' (' + left(t.pausedUntil, now) + ')'] : null,
        ['Granted', [h('strong', null, rate(t.perSecond.granted)), ' \u00b7 ', num(t.counts.granted) + ' in all']],
        ['Ended', num(t.counts.completed) + ' completed \u00b7 ' + num(t.counts.failed) + ' failed \u00b7 ' +
          num(t.counts.refunded) + ' refunded'],
        ['Refused', [h('strong', null, rate(refusedRate(t))), ' \u00b7 ', num(refused) + ' in all']],
      ]),
      h('p', { class: 'def' }, 'Granted, ended and refused: by this server since it started.'),
      sparkline(t.refusedHistory, 'Refusals per second', snap.windowMs));
    add(card, table('Refusals by reason',
      [{ label: 'Reason' }, { label: 'In all', num: true }, { label: 'Now', num: true }],
      Object.keys(REASONS).filter(function (r) { return t.counts.refused[r] > 0; }).map(function (r) {
        return [REASONS[r], num(t.counts.refused[r]), rate(t.perSecond.refused[r])];
      }),
      'No start refused by this server.'));
    add(card, table('Running permits (' + num(t.runningCount) + ')',
      [{ label: 'Key' }, { label: 'Holder' }, { label: 'Age', short: true }, { label: 'Lease left', short: true }],
      t.running.map(function (p) {
        return [scopeText(p.key), p.holder, duration(p.ageMs), duration(p.leaseLeftMs)];
      }),
      'No permit running.'));
    if (t.runningCount > t.running.length) add(card, h('p', { class: 'more' }, 'and ' + num(t.runningCount - t.running.length) + ' more'));
    var ended = t.recent.filter(function (k) { return k.lastOutcome !== null; });
    add(card, table('Recent outcomes (the last permit of each key)',
      [{ label: 'Key' }, { label: 'Outcome', short: true }, { label: 'Ended', short: true }, { label: 'Error' }],
      ended.map(function (k) {
        return [scopeText(k.key), k.lastOutcome, ago(k.lastEndAt, now), k.lastError === null ? '' : k.lastError];
      }),
      'No permit has ended yet.'));
    return card;
  }
  /** Refusals per second, every reason together; null until known for one. */
  function refusedRate(t) {
    var known = Object.keys(REASONS).filter(function (r) { return t.perSecond.refused[r] !== null; });
    if (known.length === 0) return null;
    return known.reduce(function (n, r) { return n + t.perSecond.refused[r]; }, 0);
  }

  // ---- state ----------------------------------------------------------------------------------

  function fill(id, title, cards, empty) {
    var section = document.getElementById(id);
    section.querySelector('h2').textContent = title + ' (' + cards.length + ')';
    section.querySelector('.cards').replaceChildren.apply(section.querySelector('.cards'),
      cards.length ? cards : [h('p', { class: 'empty' }, empty)]);
  }

  function render(snap) {
    fill('sequences', 'Sequences', snap.sequences.map(function (s) { return sequenceCard(s, snap); }), 'No sequence is defined.');
    fill('outbox', 'Outbox', snap.subscriptions.map(function (s) { return subscriptionCard(s, snap); }), 'No subscription.');
    fill('throttles', 'Throttles', snap.throttles.map(function (t) { return throttleCard(t, snap); }), 'No throttle is defined.');
    panels.hidden = false;
    login.hidden = true;
    say(null);
    forget.hidden = !sessionStorage.getItem(TOKEN_KEY);
    status.textContent = 'Live \u00b7 read at ' + clock(snap.at) + ' \u00b7 refreshed every ' + POLL_MS / 1000 + ' s';
    footer.textContent = 'This server is node ' + snap.nodeId + '. Rates are per second over the last 10 s; lines span ' +
      Math.round(snap.windowMs / 60000) + ' minutes.';
  }

  function say(text) {
    notice.hidden = text === null;
    notice.textContent = text || '';
  }

  /** No data on screen: what was shown goes with the token that allowed it. */
  function clear() {
    ['sequences', 'outbox', 'throttles'].forEach(function (id) {
      document.getElementById(id).querySelector('.cards').replaceChildren();
    });
    panels.hidden = true;
    footer.textContent = '';
  }

  function askForToken(text) {
    clearTimeout(timer);
    generation++;
    clear();
    forget.hidden = true;
    status.textContent = 'No data shown: a read token is needed.';
    say(text);
    login.hidden = false;
    tokenInput.focus();
  }

  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(poll, POLL_MS);
  }

  function poll() {
    clearTimeout(timer);
    var token = sessionStorage.getItem(TOKEN_KEY);
    if (needsToken && !token) {
      askForToken('This server needs a token with the read scope to show its data.');
      return;
    }
    // A hidden tab asks for nothing; it reads again as soon as it is shown.
    if (document.hidden) return schedule();
    var mine = generation;
    var headers = { accept: 'application/json' };
    if (token) headers.authorization = 'Bearer ' + token;
    fetch('v1/dashboard', { headers: headers, cache: 'no-store', credentials: 'omit' })
      .then(function (response) {
        return response.json().catch(function () { return null; }).then(function (body) {
          if (mine !== generation) return;
          if (response.status === 401 || response.status === 403) {
            sessionStorage.removeItem(TOKEN_KEY);
            askForToken(response.status === 401
              ? 'That token was not accepted (401 unauthorized). Type a valid read token.'
              : 'That token lacks the read scope (403 forbidden). Type a token with the read scope.');
            return;
          }
          if (!response.ok || body === null) {
            var why = body && body.message ? body.code + ': ' + body.message : 'status ' + response.status;
            say('The server could not read its data (' + why + '); trying again. What is shown may be old.');
            return schedule();
          }
          render(body);
          schedule();
        });
      }, function () {
        if (mine !== generation) return;
        say('The server does not answer; trying again. What is shown may be old.');
        schedule();
      });
  }

  login.addEventListener('submit', function (event) {
    event.preventDefault();
    var token = tokenInput.value.trim();
    if (!token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    tokenInput.value = '';
    login.hidden = true;
    say(null);
    status.textContent = 'Checking the token\u2026';
    generation++;
    poll();
  });
  forget.addEventListener('click', function () {
    sessionStorage.removeItem(TOKEN_KEY);
    askForToken('The token was forgotten. Type a read token to see the data again.');
  });
  document.addEventListener('visibilitychange', function () {
    if (!document.hidden && login.hidden) poll();
  });

  poll();
})();
`;
