// The JavaScript clients as applications use them, for the tests: kafkajs and
// @platformatic/kafka, from npm (package.json beside this file; the set-up installs them
// into a cache, where the tests copy this file to run it).
//   node client.mjs LIBRARY produce BOOTSTRAP TOPIC COUNT
//   node client.mjs LIBRARY consume BOOTSTRAP TOPIC GROUP COUNT
// LIBRARY: kafkajs or platformatic. Prints PRODUCED n, or CONSUMED n: the distinct values
// read (a record delivered twice counts once) within 60 seconds.
import { Consumer, Producer, stringDeserializers, stringSerializers } from '@platformatic/kafka'
import kafkajs from 'kafkajs'

const [library, mode, given, topic, ...rest] = process.argv.slice(2)
// env:NAME: the address from the environment variable NAME (KAFKA_BOOTSTRAP_SERVERS), as
// an application configured only by its environment reads it
const bootstrap = given.startsWith('env:') ? process.env[given.slice(4)] : given
const deadline = Date.now() + 60_000
const sleep = ms => new Promise(resolve => setTimeout(resolve, ms))

async function withKafkajs () {
  const kafka = new kafkajs.Kafka({ clientId: 'kafkatunnel-test', brokers: bootstrap.split(','),
    logLevel: kafkajs.logLevel.ERROR })
  if (mode === 'produce') {
    const producer = kafka.producer({ allowAutoTopicCreation: true })
    await producer.connect()
    const count = Number(rest[0])
    const messages = Array.from({ length: count }, (_, i) => ({ value: `kafkajs-${i}` }))
    const acked = await producer.send({ topic, messages, acks: -1 })
    await producer.disconnect()
    return `PRODUCED ${acked.length ? count : 0}`
  }
  const [group, count] = [rest[0], Number(rest[1])]
  const consumer = kafka.consumer({ groupId: group })
  await consumer.connect()
  await consumer.subscribe({ topic, fromBeginning: true })
  const values = new Set()
  await consumer.run({ eachMessage: async ({ message }) => { values.add(message.value.toString()) } })
  while (values.size < count && Date.now() < deadline) await sleep(100)
  await consumer.disconnect() // commits what was consumed
  return `CONSUMED ${values.size}`
}

async function withPlatformatic () {
  if (mode === 'produce') {
    const producer = new Producer({ clientId: 'kafkatunnel-test', bootstrapBrokers: [bootstrap],
      serializers: stringSerializers, autocreateTopics: true })
    const count = Number(rest[0])
    const messages = Array.from({ length: count }, (_, i) => ({ topic, value: `platformatic-${i}` }))
    await producer.send({ messages, acks: -1 })
    await producer.close()
    return `PRODUCED ${count}`
  }
  const [group, count] = [rest[0], Number(rest[1])]
  const consumer = new Consumer({ groupId: group, clientId: 'kafkatunnel-test',
    bootstrapBrokers: [bootstrap], deserializers: stringDeserializers })
  const stream = await consumer.consume({ topics: [topic], mode: 'earliest', autocommit: false,
    sessionTimeout: 10000, heartbeatInterval: 500 })
  const values = new Set()
  const timer = setTimeout(() => stream.close(), Math.max(deadline - Date.now(), 0))
  for await (const message of stream) {
    values.add(message.value)
    await message.commit()
    if (values.size >= count) break
  }
  clearTimeout(timer)
  await stream.close()
  await consumer.close(true)
  return `CONSUMED ${values.size}`
}

const said = await (library === 'kafkajs' ? withKafkajs() : withPlatformatic())
console.log(said)
process.exit(0)
