// The official Node.js 5.x client (npm rocketmq-client-nodejs) side of bench/proxy_node.py.
//
//   node proxy_node_worker.js send ENDPOINT TOPIC COUNT SIZE WINDOW
//   node proxy_node_worker.js receive ENDPOINT TOPIC GROUP COUNT
//
// Prints {"phase": "start"} when the timed part starts, then one result line with the seconds,
// the count and this process's CPU seconds over the timed part (process.cpuUsage).
'use strict';
const { Producer, SimpleConsumer } = require('rocketmq-client-nodejs');

function start() {
  process.stdout.write(JSON.stringify({ phase: 'start' }) + '\n');
  return [process.hrtime.bigint(), process.cpuUsage()];
}

function result(mark, extra) {
  const seconds = Number(process.hrtime.bigint() - mark[0]) / 1e9;
  const cpu = process.cpuUsage(mark[1]);
  const out = { seconds, cpu_seconds: (cpu.user + cpu.system) / 1e6, ...extra };
  process.stdout.write(JSON.stringify(out) + '\n');
}

async function send(endpoint, topic, count, size, window) {
  const producer = new Producer({ endpoints: endpoint, topics: [topic], requestTimeout: 10000 });
  await producer.startup();
  const body = Buffer.alloc(size, 'x');
  const one = () => producer.send({ topic, body });
  for (let i = 0; i < 20; i++) await one();
  let failed = 0;
  const mark = start();
  let left = count;
  while (left > 0) {
    const batch = Math.min(window, left);
    const done = await Promise.allSettled(Array.from({ length: batch }, one));
    failed += done.filter((d) => d.status === 'rejected').length;
    left -= batch;
  }
  result(mark, { failed });
  await producer.shutdown();
}

async function receive(endpoint, topic, group, count) {
  const consumer = new SimpleConsumer({
    endpoints: endpoint,
    consumerGroup: group,
    subscriptions: new Map().set(topic, '*'),
    awaitDuration: 2000,
    requestTimeout: 10000,
  });
  await consumer.startup();
  let acked = 0;
  const deadline = Date.now() + 300000;
  const mark = start();
  while (acked < count && Date.now() < deadline) {
    const messages = await consumer.receive(32, 30000);
    for (const message of messages) {
      await consumer.ack(message);
      acked += 1;
    }
  }
  result(mark, { received: acked });
  await consumer.shutdown();
}

const [command, ...args] = process.argv.slice(2);
const main = command === 'send'
  ? send(args[0], args[1], Number(args[2]), Number(args[3]), Number(args[4]))
  : receive(args[0], args[1], args[2], Number(args[3]));
main.then(() => process.exit(0), (err) => {
  process.stderr.write(String(err && err.stack || err) + '\n');
  process.exit(1);
});
