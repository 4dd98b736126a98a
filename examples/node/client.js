#!/usr/bin/env node
// An mpcml client in Node.js: submit a job, watch its events, print its public result.
//
// It loads the published protos (protos/mpcml/v1) at run time with @grpc/proto-loader and talks
// to the coordinator's `mpcml.v1.Coordinator` service over mutual TLS, as the Python client
// does. The job is a whole `JobSpec` in the proto3 JSON mapping (see digits_infer.json and
// README.md): a client outside Python cannot trace a torch model into a graph itself.
//
// Exit status: 0 when the job COMPLETED; 1 when it failed or was cancelled, or on any error
// (bad arguments, unreadable files, a refused call), with the gRPC status name and message.
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const crypto = require('node:crypto');
const { parseArgs } = require('node:util');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const DEFAULT_PROTOS = path.resolve(__dirname, '..', '..', 'protos');
const CALL_TIMEOUT_S = 30;
const RECONNECT_DELAY_MS = 1000;

const USAGE = `usage: node client.js [options] SPEC.json

Submits the JobSpec in SPEC.json (proto3 JSON) to the coordinator, prints the job's events
until it ends, then its public result. Exits 0 when the job COMPLETED, 1 otherwise.

options (the first five default to the environment variables the Python CLI reads):
  --coordinator HOST:PORT  the coordinator (MPCML_COORDINATOR, else 127.0.0.1:7000)
  --ca FILE                the CA certificate (MPCML_CA)
  --cert FILE              this client's certificate, role "client" (MPCML_CERT)
  --key FILE               this client's private key (MPCML_KEY)
  --server-name NAME       the name on the coordinator's certificate
                           (MPCML_SERVER_NAME, else "coordinator")
  --protos DIR             where mpcml/v1/*.proto are (default: the repository's protos/)
  --idempotency-key KEY    resubmitting with the same key gives the same job (default: random)
  --timeout SECONDS        give up watching after this long (default 600)
  -h, --help               this text`;

/** An expected failure (bad input, a refused call): its message is printed, not its stack. */
class Failure extends Error {}

/** The options, from the command line over the environment. */
function options(argv, env) {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      allowPositionals: true,
      options: {
        coordinator: { type: 'string', default: env.MPCML_COORDINATOR || '127.0.0.1:7000' },
        ca: { type: 'string', default: env.MPCML_CA || '' },
        cert: { type: 'string', default: env.MPCML_CERT || '' },
        key: { type: 'string', default: env.MPCML_KEY || '' },
        'server-name': { type: 'string', default: env.MPCML_SERVER_NAME || 'coordinator' },
        protos: { type: 'string', default: DEFAULT_PROTOS },
        'idempotency-key': { type: 'string', default: '' },
        timeout: { type: 'string', default: '600' },
        help: { type: 'boolean', short: 'h', default: false },
      },
    });
  } catch (err) {
    throw new Failure(`${err.message}\n\n${USAGE}`);
  }
  const { values, positionals } = parsed;
  if (values.help) {
    console.log(USAGE);
    process.exit(0);
  }
  if (positionals.length !== 1) {
    throw new Failure(`give exactly one job spec file\n\n${USAGE}`);
  }
  for (const name of ['ca', 'cert', 'key']) {
    if (!values[name]) {
      const variable = `MPCML_${name.toUpperCase()}`;
      throw new Failure(`--${name} is required (or set ${variable}): the coordinator only `
        + 'accepts mutual TLS');
    }
  }
  const timeout = Number(values.timeout);
  if (!(timeout > 0)) {
    throw new Failure(`--timeout must be a number of seconds above 0, got ${values.timeout}`);
  }
  return { ...values, timeout, spec: positionals[0] };
}

/** A file's bytes, or a Failure saying which file could not be read and why. */
function readFile(file, what) {
  try {
    return fs.readFileSync(file);
  } catch (err) {
    throw new Failure(`cannot read ${what} ${file}: ${err.message}`);
  }
}

/** The coordinator's package definition: every mpcml.v1 message, enum and service. */
function loadProtos(dir) {
  const file = path.join(dir, 'mpcml', 'v1', 'coordinator.proto');
  if (!fs.existsSync(file)) {
    throw new Failure(`no ${file}: --protos must name the folder that holds mpcml/v1/`);
  }
  // Field names in lowerCamelCase (the proto3 JSON names); 64-bit integers and enums as
  // strings, as the JSON mapping writes them; defaults filled in so every event has its fields.
  return protoLoader.loadSync('mpcml/v1/coordinator.proto', {
    includeDirs: [dir],
    keepCase: false,
    longs: String,
    enums: String,
    defaults: true,
    oneofs: true,
  });
}

/**
 * Checks that `value` only uses field names of the message `typeName`, recursively.
 *
 * protobufjs silently drops unknown keys, so a misspelt or snake_case name would otherwise
 * reach the coordinator as an empty field.
 */
function checkFields(definition, typeName, value, where) {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw new Failure(`${where || 'the top level'}: expected a JSON object (a ${typeName})`);
  }
  const type = definition[typeName].type;
  const pkg = typeName.slice(0, typeName.lastIndexOf('.'));
  for (const [key, item] of Object.entries(value)) {
    const here = where ? `${where}.${key}` : key;
    const field = type.field.find((f) => f.name === key);
    if (!field) {
      const names = type.field.map((f) => f.name).join(', ');
      throw new Failure(`${here}: ${typeName} has no field "${key}" (its fields, in the `
        + `proto3 JSON mapping's lowerCamelCase: ${names})`);
    }
    if (field.type !== 'TYPE_MESSAGE') continue;
    const entry = type.nestedType.find((n) => n.name === field.typeName && n.options?.mapEntry);
    if (entry) {
      const valueField = entry.field.find((f) => f.name === 'value');
      if (valueField.type === 'TYPE_MESSAGE') {
        const valueType = resolve(definition, pkg, valueField.typeName);
        for (const [k, v] of Object.entries(item || {})) {
          checkFields(definition, valueType, v, `${here}["${k}"]`);
        }
      }
      continue;
    }
    const fieldType = resolve(definition, pkg, field.typeName);
    const items = field.label === 'LABEL_REPEATED' ? item : [item];
    if (!Array.isArray(items)) {
      throw new Failure(`${here}: expected a JSON array`);
    }
    items.forEach((v, i) => {
      const at = field.label === 'LABEL_REPEATED' ? `${here}[${i}]` : here;
      checkFields(definition, fieldType, v, at);
    });
  }
}

/** The full name of a message type named in package `pkg`. */
function resolve(definition, pkg, name) {
  const bare = name.replace(/^\./, '');
  return definition[bare] ? bare : `${pkg}.${bare}`;
}

/** The JobSpec in `file`, checked against the protos. */
function readSpec(definition, file) {
  let spec;
  try {
    spec = JSON.parse(readFile(file, 'the job spec').toString('utf8'));
  } catch (err) {
    if (err instanceof Failure) throw err;
    throw new Failure(`the job spec ${file} is not valid JSON: ${err.message}`);
  }
  try {
    checkFields(definition, 'mpcml.v1.JobSpec', spec, '');
  } catch (err) {
    throw new Failure(`the job spec ${file} is not a JobSpec: ${err.message}`);
  }
  return spec;
}

/** A gRPC error as "CODE_NAME: message". */
function describe(err) {
  const name = Object.keys(grpc.status).find((k) => grpc.status[k] === err.code);
  return name === undefined ? err.message : `${name}: ${err.details || err.message}`;
}

/** A unary call as a promise, with a deadline; a coordinator still starting is waited for. */
function unary(client, method, request) {
  const deadline = new Date(Date.now() + CALL_TIMEOUT_S * 1000);
  return new Promise((resolvePromise, reject) => {
    client[method](request, new grpc.Metadata(), { deadline, waitForReady: true }, (err, reply) => {
      if (err) {
        const hint = err.code === grpc.status.DEADLINE_EXCEEDED
          ? ` (no answer within ${CALL_TIMEOUT_S} s: is the coordinator running and reachable, `
            + 'and do it and this client trust the same CA?)'
          : '';
        reject(new Failure(`${method} failed: ${describe(err)}${hint}`));
      } else {
        resolvePromise(reply);
      }
    });
  });
}

/** The public metrics of an event or a round, as "name value, ...". */
function metricsText(metrics) {
  return Object.entries(metrics || {})
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([name, value]) => `${name} ${Number(value).toFixed(4)}`)
    .join(', ');
}

/** One line per event of the job. */
function eventLine(event) {
  const total = Number(event.totalRounds);
  const of = total ? `/${total}` : '';
  let what;
  switch (event.kind) {
    case 'submitted':
      what = `submitted: ${total} round${total === 1 ? '' : 's'}`;
      break;
    case 'state':
      what = `state ${event.state}`;
      break;
    case 'round_started':
      what = `round ${event.round}${of} started`;
      break;
    case 'round_done':
      what = `round ${event.round}${of} done`;
      break;
    case 'party_ready':
      what = `party ${event.message} ready`;
      break;
    case 'party_finished':
      what = `party ${event.message} finished`;
      break;
    case 'resumed':
      what = `resumed after round ${event.round}`;
      break;
    case 'final_metrics':
      what = 'final metrics';
      break;
    default: // a kind newer than this client
      what = event.kind;
  }
  const metrics = metricsText(event.metrics);
  const detail = event.kind.startsWith('party_') ? '' : event.message;
  return `event ${event.seq} ${what}`
    + (metrics ? ` [${metrics}]` : '')
    + (detail ? ` (${detail})` : '');
}

function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

/**
 * Prints the job's events until the coordinator ends the stream (the job has ended).
 *
 * A dropped connection (UNAVAILABLE) is watched again from the last event seen, until
 * `timeoutS` has passed.
 */
async function watch(client, jobId, timeoutS) {
  const deadlineMs = Date.now() + timeoutS * 1000;
  let afterSeq = '0';
  for (;;) {
    const outcome = await new Promise((resolvePromise) => {
      const call = client.WatchJob(
        { jobId, afterSeq },
        { deadline: new Date(deadlineMs) },
      );
      call.on('data', (event) => {
        afterSeq = event.seq;
        console.log(eventLine(event));
      });
      call.on('end', () => resolvePromise(null));
      call.on('error', (err) => resolvePromise(err));
    });
    if (outcome === null) return;
    if (outcome.code === grpc.status.DEADLINE_EXCEEDED) {
      throw new Failure(`job ${jobId} did not end within ${timeoutS} s (--timeout); it goes on `
        + 'running at the parties');
    }
    if (outcome.code !== grpc.status.UNAVAILABLE || Date.now() > deadlineMs) {
      throw new Failure(`WatchJob failed: ${describe(outcome)}`);
    }
    console.error(`the coordinator is unavailable (${describe(outcome)}); watching again`);
    await sleep(RECONNECT_DELAY_MS);
  }
}

/** Prints the public result; returns whether the job COMPLETED. */
function printResult(result) {
  const status = result.status;
  console.log(`job ${status.jobId} ${status.state}` + (status.reason ? `: ${status.reason}` : ''));
  for (const warning of status.warnings || []) console.log(`warning: ${warning}`);
  for (const round of result.rounds || []) {
    const metrics = metricsText(round.metrics);
    if (metrics) console.log(`round ${round.round}: ${metrics}`);
  }
  const metrics = metricsText(status.metrics);
  if (metrics) console.log(`metrics: ${metrics}`);
  for (const out of result.outputs || []) {
    const shape = (out.shape || []).join('x') || 'n/a';
    console.log(`output ${out.output} to ${out.party}: ${out.path} (shape ${shape})`);
  }
  console.log(`rounds ${status.totalRounds}, ${result.bytesSent} bytes sent by the parties, `
    + `${result.communicationRounds} communication rounds, ${Number(result.seconds).toFixed(1)} s`);
  return status.state === 'COMPLETED';
}

async function main() {
  const opts = options(process.argv.slice(2), process.env);
  const definition = loadProtos(opts.protos);
  const spec = readSpec(definition, opts.spec);
  const ca = readFile(opts.ca, 'the CA certificate');
  const key = readFile(opts.key, 'the client key');
  const cert = readFile(opts.cert, 'the client certificate');
  let credentials;
  try {
    credentials = grpc.credentials.createSsl(ca, key, cert);
  } catch (err) {
    throw new Failure(`cannot use ${opts.ca}, ${opts.cert} and ${opts.key} for TLS: ${err.message}`);
  }
  const { mpcml } = grpc.loadPackageDefinition(definition);
  // The coordinator's certificate carries its role name, whatever address it is reached on.
  const client = new mpcml.v1.Coordinator(opts.coordinator, credentials, {
    'grpc.ssl_target_name_override': opts['server-name'],
    'grpc.keepalive_time_ms': 10000,
    'grpc.keepalive_timeout_ms': 5000,
  });
  process.once('SIGINT', () => {
    console.error('interrupted: the job, if submitted, goes on running (`mpcml job cancel ID`)');
    client.close();
    process.exit(1);
  });
  try {
    const idempotencyKey = opts['idempotency-key'] || crypto.randomUUID();
    const status = await unary(client, 'SubmitJob', { spec, idempotencyKey });
    console.log(`submitted job ${status.jobId} (${status.name || 'unnamed'}) to `
      + `${opts.coordinator}: ${status.state}, parties ${status.parties.join(', ')}`);
    await watch(client, status.jobId, opts.timeout);
    const result = await unary(client, 'GetResult', { jobId: status.jobId });
    return printResult(result) ? 0 : 1;
  } finally {
    client.close();
  }
}

main().then(
  (code) => process.exit(code),
  (err) => {
    // A Failure carries a message for people; anything else is a bug in this client.
    console.error(err instanceof Failure ? `error: ${err.message}` : err);
    process.exit(1);
  },
);
