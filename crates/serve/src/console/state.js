// The page's state, shared by its modules (one object, no framework).

export const $ = (id) => document.getElementById(id);

export const state = {
  server: null,
  sessions: new Map(), // key -> { view, row }
  sort: { col: "last", dir: -1 },
  filter: "",
  dirty: new Set(), // keys whose rows need redrawing
  stale: new Set(), // keys to fetch again
  resort: false,
  limit: 100, // rows shown: the first ones in the sort order ("show more" adds 100)
  shown: [], // the entries in the table now, in order
  frame: 0,
  live: null, // the lifecycle stream's AbortController
  turn: null, // the followed turn
  sessionView: null, // the open session's view (its workspace, for the send box)
  route: "",
  lastFull: 0, // when the whole list was last fetched (performance.now())
  refreshing: false, // a whole-list fetch a `reset` asked for is under way
  refreshAgain: false, // and another reset came meanwhile
  received: new Map(), // key -> when its first unpainted event came (profiling)
  painted: false,
  // Set by a benchmark (sessionStorage `warden-profile`): the page then
  // records how long it takes to draw what it receives (User Timing).
  profile: sessionStorage.getItem("warden-profile") === "1",
  timers: false, // the periodic refreshes, started at the first sign-in
  health: null, // the /readyz poll's interval
  databaseDown: false, // this node cannot reach its database (a cluster node)
  streaming: null, // the lifecycle stream: connected, reconnecting, or not started
};

/** What modules call back into the page's entry (set by console.js). */
export const hooks = {
  /** Forgets the token and shows the sign-in form with `message`. */
  signOut: (_message) => {},
};

export function measure(name, start, detail) {
  if (state.profile) performance.measure(name, { start, end: performance.now(), detail });
}
