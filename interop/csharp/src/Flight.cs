// A flight is one process's pursuit of one value: every caller of Get for
// that id in this process shares it, so N callers cost what one costs. The
// group is that coalescing layer, and knows nothing of Redis.
using System;
using System.Collections.Generic;
using System.Threading;

namespace MemoLockNet
{
    enum FlightState { Looking, Holding, Abandoned, Finished }

    sealed class Flight
    {
        public string Id;          // as the caller gave it (for messages)
        public byte[] Key;         // the id as sent to Redis
        public string Token;       // the lock token of every attempt of this flight
        public Func<Lease, ValueTuple<byte[], TimeSpan>> Fetch;
        public Action<Lease> Start; // external-producer mode when set
        /// <summary>The holder whose lock the flight took over after waiting on it; its waiters hear of a failure too (FlightEngine.Relay).</summary>
        public string TookOverFrom;

        public readonly ManualResetEvent Done = new ManualResetEvent(false);
        public readonly CancellationTokenSource Cancel = new CancellationTokenSource(); // abandoned, or Close
        public byte[] Val;
        public Exception Err;

        // Guarded by the group's lock.
        public int Refs;
        public FlightState State;
    }

    sealed class FlightGroup
    {
        readonly object mu = new object();
        readonly Dictionary<string, Flight> flights = new Dictionary<string, Flight>();
        bool closed;
        public long Gets, Coalesced;

        /// <summary>True once Close began: set before any flight is cancelled.</summary>
        public bool Closed { get { lock (mu) return closed; } }

        /// <summary>Joins the flight for key, making one with mk if none runs (the caller then leads).</summary>
        public Flight Join(string key, Func<Flight> mk, out bool leader)
        {
            lock (mu)
            {
                Gets++;
                if (closed) throw new MemoLockClosedException();
                Flight f;
                if (flights.TryGetValue(key, out f)) { f.Refs++; Coalesced++; leader = false; return f; }
                f = mk();
                f.Refs = 1;
                flights[key] = f;
                leader = true;
                return f;
            }
        }

        /// <summary>Drops one caller; a looking flight with none left is abandoned.</summary>
        public void Leave(Flight f)
        {
            lock (mu)
            {
                f.Refs--;
                if (f.Refs == 0 && f.State == FlightState.Looking)
                {
                    f.State = FlightState.Abandoned;
                    Forget(f);
                    f.Cancel.Cancel();
                }
            }
        }

        void Forget(Flight f)
        {
            Flight cur;
            string k = Bytes.Latin1(f.Key);
            if (flights.TryGetValue(k, out cur) && cur == f) flights.Remove(k);
        }

        /// <summary>Moves f to holding; false if every caller left or Close began.</summary>
        public bool Hold(Flight f)
        {
            lock (mu)
            {
                if (closed || (f.State != FlightState.Looking && f.State != FlightState.Holding)) return false;
                f.State = FlightState.Holding;
                return true;
            }
        }

        /// <summary>Ends a holding flight nobody waits for; true if f had no callers.</summary>
        public bool Retire(Flight f)
        {
            lock (mu)
            {
                if (f.Refs > 0) return false;
                f.State = FlightState.Abandoned;
                Forget(f);
                return true;
            }
        }

        /// <summary>Hands the result to the callers; only the first call counts.</summary>
        public bool Finish(Flight f, byte[] val, Exception err)
        {
            lock (mu)
            {
                if (f.State == FlightState.Finished) return false;
                f.State = FlightState.Finished;
                Forget(f);
                f.Val = val;
                f.Err = err;
            }
            f.Done.Set();
            return true;
        }

        /// <summary>Closes the group and returns its flights; null if closed already.</summary>
        public List<Flight> Close()
        {
            lock (mu)
            {
                if (closed) return null;
                closed = true;
                return new List<Flight>(flights.Values);
            }
        }
    }
}
